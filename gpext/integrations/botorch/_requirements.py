"""Check that the optional ``botorch`` dependency is importable (no BoTorch import here)."""

from __future__ import annotations

import importlib

from gpext.errors import MissingExtraError

__all__ = ["MissingExtraError", "require_botorch"]


def require_botorch() -> None:
    """Import ``botorch`` or raise :class:`MissingExtraError` telling how to install it.

    Raises:
        MissingExtraError: If ``botorch`` cannot be imported.
    """
    try:
        importlib.import_module("botorch")
    except ImportError as err:
        raise MissingExtraError(
            "gpext.integrations.botorch: expected the optional dependency 'botorch', got an "
            f"ImportError ({err}). Install it with `pip install gpext[botorch]`."
        ) from err
