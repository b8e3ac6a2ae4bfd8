"""tqdm progress bars that switch themselves off when stderr is not a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm

__all__ = ["progress_bar", "progress_enabled"]

#: Set ``GPEXT_PROGRESS=0`` to silence every bar, ``1`` to force them on.
PROGRESS_ENV = "GPEXT_PROGRESS"


def progress_enabled(show: bool | None = None) -> bool:
    """Decide whether a progress bar is shown.

    Args:
        show: Explicit choice. ``None`` means: honour ``$GPEXT_PROGRESS`` if set, otherwise show
            bars only when stderr is an interactive terminal (so CI logs stay clean).

    Returns:
        ``True`` when the bar should be drawn.
    """
    if show is not None:
        return bool(show)
    env = os.environ.get(PROGRESS_ENV)
    if env is not None:
        return env.strip().lower() not in ("0", "false", "no", "off", "")
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    show: bool | None = None,
    leave: bool = False,
    **kwargs: Any,
) -> tqdm:
    """Wrap ``iterable`` in a tqdm bar, disabled when :func:`progress_enabled` says so.

    Args:
        iterable: What to iterate over (``None`` for a manually updated bar).
        total: Number of steps, if ``iterable`` has no ``len``.
        desc: Label printed before the bar.
        show: See :func:`progress_enabled`.
        leave: Keep the bar on screen after it finishes.
        **kwargs: Passed on to :class:`tqdm.tqdm`.

    Returns:
        The tqdm object (iterate over it, or call ``update``/``set_postfix``).
    """
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        disable=not progress_enabled(show),
        leave=leave,
        dynamic_ncols=True,
        **kwargs,
    )
