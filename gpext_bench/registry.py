"""The registry of methods that ``gpext bench`` can run.

A method is a function ``fit_predict(split, config) -> Prediction`` registered under a name and
a task.  Capability modules register their methods at import; :func:`list_methods` imports the
built-in modules listed in :data:`BUILTIN_METHOD_MODULES` on first use, so registering a new
family of methods means adding its module there.

Example:
    >>> from gpext_bench import Prediction, register_method
    >>> @register_method("my_gp", task="regression", description="My GP")
    ... def fit_my_gp(split, config):
    ...     ...
    ...     return Prediction(mean=mean, variance=variance)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpext.errors import InputDataError, ShapeError, expected_got

__all__ = [
    "BUILTIN_METHOD_MODULES",
    "BenchConfig",
    "BenchMethod",
    "Prediction",
    "get_method",
    "list_methods",
    "register_method",
]

#: Modules whose import registers methods.  Each capability adds its own module here.
BUILTIN_METHOD_MODULES: list[str] = [
    "gpext_bench.baselines",
    "gpext_bench.methods_ign",
    "gpext_bench.methods_bootstrap",
    "gpext_bench.methods_classification",
    "gpext_bench.methods_gwi",
    "gpext_bench.methods_subspace",
    "gpext_bench.methods_peers",
    "gpext_bench.methods_subspace_glm",
    "gpext_bench.methods_subspace_auto",
]

TASKS = ("regression", "classification")


@dataclass(frozen=True)
class BenchConfig:
    """Settings shared by every method in one benchmark run.

    Attributes:
        quick: Use the reduced budget (fewer iterations / inducing points) of ``--quick``.
        seed: Base random seed; each (dataset, split, method) fit reseeds from it.
        dtype: Floating dtype of the data and models.
        device: Device the models are trained on.
        show_progress: Progress bars (``None``: only on an interactive terminal).
    """

    quick: bool = False
    seed: int = 0
    dtype: torch.dtype = torch.float64
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    show_progress: bool | None = None

    def budget(self, quick_value, full_value):
        """Return ``quick_value`` in quick mode and ``full_value`` otherwise."""
        return quick_value if self.quick else full_value


@dataclass
class Prediction:
    """A method's predictions on a test set.

    Regression predictions are in the *standardised* target units of the split (the runner maps
    them back to original units): either a Gaussian ``mean``/``variance`` (shape ``(M,)``, the
    variance including observation noise) or a mixture of ``K`` Gaussians
    ``mixture_means``/``mixture_variances`` (shape ``(K, M)``, equal weights unless
    ``mixture_weights`` is given).  Classification predictions are class probabilities
    ``probs`` of shape ``(M, C)``.
    """

    mean: torch.Tensor | None = None  # shape: (M,)
    variance: torch.Tensor | None = None  # shape: (M,)
    mixture_means: torch.Tensor | None = None  # shape: (K, M)
    mixture_variances: torch.Tensor | None = None  # shape: (K, M)
    mixture_weights: torch.Tensor | None = None  # shape: (K,)
    probs: torch.Tensor | None = None  # shape: (M, C)
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mixture_means is not None:
            if self.mixture_variances is None or (
                self.mixture_variances.shape != self.mixture_means.shape
            ):
                raise ShapeError(
                    expected_got(
                        "Prediction.mixture_variances",
                        "a tensor with the shape of mixture_means",
                        None
                        if self.mixture_variances is None
                        else tuple(self.mixture_variances.shape),
                    )
                )
            if self.mean is None:
                w = self._weights()
                mm = self.mixture_means
                self.mean = (w[:, None] * mm).sum(0)
                second = (w[:, None] * (self.mixture_variances + mm**2)).sum(0)
                self.variance = (second - self.mean**2).clamp_min(0.0)
        if self.probs is None and (self.mean is None or self.variance is None):
            raise InputDataError(
                "Prediction: expected either probs, mean and variance, or mixture_means and "
                "mixture_variances, got none of these."
            )

    def _weights(self) -> torch.Tensor:
        k = self.mixture_means.shape[0]
        if self.mixture_weights is None:
            return self.mixture_means.new_full((k,), 1.0 / k)
        return self.mixture_weights.to(self.mixture_means)

    @property
    def is_mixture(self) -> bool:
        """Whether the regression prediction is a Gaussian mixture."""
        return self.mixture_means is not None


@dataclass(frozen=True)
class BenchMethod:
    """A registered method: its name, task, fit-and-predict function and a description."""

    name: str
    task: str
    fit_predict: Callable[..., Prediction]
    description: str = ""
    module: str = ""
    default: bool = True


_REGISTRY: dict[str, BenchMethod] = {}
_LOADED = False


def register_method(
    name: str, task: str, description: str = "", *, default: bool = True
) -> Callable[[Callable[..., Prediction]], Callable[..., Prediction]]:
    """Decorator registering ``fit_predict(split, config) -> Prediction`` under ``name``.

    Args:
        name: Unique method name used on the command line.
        task: ``"regression"`` or ``"classification"``.
        description: One line shown by ``gpext bench --list``.
        default: Whether ``gpext bench`` runs the method when no ``--methods`` are named.
            Reference recipes and ablations register with ``default=False``; they still run
            when named or with ``--methods all``.

    Raises:
        InputDataError: If the task is unknown or the name is already registered elsewhere.
    """
    if task not in TASKS:
        raise InputDataError(expected_got("register_method.task", f"one of {TASKS}", task))

    def decorator(fn: Callable[..., Prediction]) -> Callable[..., Prediction]:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.module != fn.__module__:
            raise InputDataError(
                f"register_method: the name {name!r} is already registered by "
                f"{existing.module}; choose another name."
            )
        _REGISTRY[name] = BenchMethod(name, task, fn, description, fn.__module__, default)
        return fn

    return decorator


def _load_builtins() -> None:
    global _LOADED
    if _LOADED:
        return
    for mod in BUILTIN_METHOD_MODULES:
        importlib.import_module(mod)
    _LOADED = True


def list_methods(task: str | None = None, *, default_only: bool = False) -> list[BenchMethod]:
    """Registered methods (optionally of one task, optionally only defaults), in order."""
    _load_builtins()
    return [
        m
        for m in _REGISTRY.values()
        if (task is None or m.task == task) and (m.default or not default_only)
    ]


def get_method(name: str) -> BenchMethod:
    """Look a method up by name.

    Raises:
        InputDataError: If no method has that name (the message lists the registered ones).
    """
    _load_builtins()
    if name not in _REGISTRY:
        raise InputDataError(
            expected_got(
                "method",
                f"one of {sorted(_REGISTRY)}",
                repr(name),
                "Run `gpext bench --list` to see the registered methods.",
            )
        )
    return _REGISTRY[name]
