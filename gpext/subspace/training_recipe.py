"""SGD training recipes for weight-space inference and their choice on held-out rows.

A :class:`TrainingRecipe` holds the settings of the SGD run whose trajectory every weight
posterior is built from (:func:`~gpext.subspace.train_sgd_trajectory`). :data:`DRBAYES_RECIPES`
are the per-dataset recipes of drbayes's small-UCI experiments (000 Sec. IV-B; hyper-parameters
read from drbayes's run script, no code taken) and :data:`GPEXT_RECIPE` the recipe of the
earlier gpext protocol:

==========  ======  =====  ======  ============  ============
data set    epochs  batch  lr      weight decay  collect from
==========  ======  =====  ======  ============  ============
boston      300     30     1e-3    1e-1          epoch 200
concrete    1000    100    1e-3    1e-2          epoch 500
energy      1000    100    1e-3    1e-1          epoch 500
naval       1000    100    5e-4    1e-4          epoch 500
yacht       1000    30     1e-3    1e-1          epoch 500
gpext       200     N/10   1e-2(*) 1e-3          epoch 100
==========  ======  =====  ======  ============  ============

(*) cosine-decayed from 1e-2 to 5e-3 over the first 100 epochs, then constant.

Neither recipe carries over to every data set (on yacht drbayes's weight decay of 0.1 leaves a
one-hidden-layer network underfit; on naval the gpext recipe trains 50 times fewer steps than
drbayes's), so :func:`select_recipe` chooses between candidates (:func:`recipe_candidates`) by a
held-out score: this is the validated recipe of ``benchmarks/subspace_uci.py`` and of
:func:`gpext.integrations.botorch.fit_weight_ensemble`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from gpext.errors import GpextError, InputDataError, expected_got
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.sgd_trajectory import train_sgd_trajectory
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.utils import check_positive_int

__all__ = [
    "DRBAYES_RECIPES",
    "GPEXT_RECIPE",
    "RecipeSelection",
    "TrainingRecipe",
    "recipe_candidates",
    "select_recipe",
    "training_recipe",
]


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    r"""SGD settings of a training run with SWA collection (momentum 0.9).

    Epochs ``0 .. collect_from - 1`` use the rate ``lr``, cosine-decayed towards ``swa_lr``
    when that is set; from ``collect_from`` on the rate is the constant ``swa_lr`` (``lr``
    when ``None``) and the weights are collected once per epoch:

    .. math::

        \eta_e = \eta_{\text{swa}} + \tfrac12(\eta - \eta_{\text{swa}})
            \big(1 + \cos(\pi e / e_0)\big) \ (e < e_0), \qquad \eta_e = \eta_{\text{swa}}
            \ (e \ge e_0).

    Attributes:
        epochs: Total epochs.
        batch_size: Mini-batch size (``None``: ``ceil(N / 10)``).
        lr: Learning rate :math:`\eta` of the first ``collect_from`` epochs.
        weight_decay: SGD weight decay.
        collect_from: First collecting epoch :math:`e_0`.
        swa_lr: Constant rate :math:`\eta_{\text{swa}}` of the collection phase (``None``:
            ``lr``, a constant rate throughout, as drbayes).

    Raises:
        InputDataError: For non-positive epochs or rates, a negative weight decay, or
            ``collect_from`` outside ``[0, epochs)``.

    Example:
        >>> TrainingRecipe(100, None, 1e-2, 1e-3, 50).num_collections
        50
    """

    epochs: int
    batch_size: int | None
    lr: float
    weight_decay: float
    collect_from: int
    swa_lr: float | None = None

    def __post_init__(self) -> None:
        check_positive_int(self.epochs, "TrainingRecipe.epochs")
        if self.batch_size is not None:
            check_positive_int(self.batch_size, "TrainingRecipe.batch_size")
        if not 0 <= self.collect_from < self.epochs:
            raise InputDataError(
                expected_got(
                    "TrainingRecipe.collect_from",
                    f"in [0, epochs={self.epochs})",
                    self.collect_from,
                )
            )
        rates = (self.lr, self.lr if self.swa_lr is None else self.swa_lr)
        if not all(math.isfinite(r) and r > 0 for r in rates) or not self.weight_decay >= 0:
            raise InputDataError(
                expected_got(
                    "TrainingRecipe(lr, swa_lr, weight_decay)",
                    "positive rates and a non-negative weight decay",
                    (self.lr, self.swa_lr, self.weight_decay),
                )
            )

    @property
    def num_collections(self) -> int:
        """Number of collections (one per epoch of the collection phase)."""
        return self.epochs - self.collect_from

    def with_epochs(self, epochs: int) -> TrainingRecipe:
        """The same recipe over ``epochs`` epochs, collecting over the same fraction of them.

        ``collect_from`` becomes ``round(collect_from * epochs / self.epochs)``, kept in
        ``[0, epochs - 1]``; every other setting is unchanged.

        Example:
            >>> DRBAYES_RECIPES["boston"].with_epochs(30).collect_from
            20
        """
        epochs = check_positive_int(epochs, "TrainingRecipe.with_epochs(epochs)")
        start = min(max(round(self.collect_from * epochs / self.epochs), 0), epochs - 1)
        return TrainingRecipe(
            epochs, self.batch_size, self.lr, self.weight_decay, start, self.swa_lr
        )

    def shortened(self, divisor: int, *, min_epochs: int = 20, min_collections: int = 20):
        """A shorter run for smoke tests and quick benchmarks.

        ``max(epochs // divisor, min_epochs)`` epochs with the same collecting fraction
        (:meth:`with_epochs`), but collecting over at least the last ``min_collections`` epochs
        (so that rank-20 subspaces can be built).

        Example:
            >>> DRBAYES_RECIPES["boston"].shortened(10).collect_from
            10
        """
        divisor = check_positive_int(divisor, "TrainingRecipe.shortened(divisor)")
        recipe = self.with_epochs(max(self.epochs // divisor, min_epochs))
        start = min(recipe.collect_from, max(recipe.epochs - min_collections, 0))
        return dataclasses.replace(recipe, collect_from=start)

    def train(
        self,
        module: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        likelihood: OutputLikelihood,
        *,
        max_deviations: int = 20,
        max_grad_norm: float | None = 10.0,
        momentum: float = 0.9,
        standardize: bool | str = True,
        **kwargs: Any,
    ) -> TrajectoryCollector:
        """Run :func:`~gpext.subspace.train_sgd_trajectory` with this recipe.

        Args:
            module: The network (trained in place).
            x: Training inputs. # shape: (N, ...)
            y: Training targets. # shape: (N,)
            likelihood: Output likelihood.
            max_deviations: Deviation buffer size ``K``.
            max_grad_norm: Gradient clipping norm (10: the benchmark's safety net against a
                heteroscedastic step that throws the weights into another basin).
            momentum: SGD momentum.
            standardize: The data contract of
                :func:`~gpext.subspace.train_sgd_trajectory` (default on: the network gets an
                input standardisation and the likelihood a target transform fitted on ``x``
                and ``y``, unless they have them; ``False``: the data as given;
                ``"inputs"`` / ``"targets"``: only those).
            **kwargs: Passed on (``observers``, ``step_observers``, ``generator``,
                ``show_progress``).

        Returns:
            The :class:`~gpext.subspace.TrajectoryCollector`.
        """
        return train_sgd_trajectory(
            module,
            x,
            y,
            likelihood,
            epochs=self.epochs,
            swa_start=self.collect_from,
            lr=self.lr,
            swa_lr=self.lr if self.swa_lr is None else self.swa_lr,
            momentum=momentum,
            weight_decay=self.weight_decay,
            batch_size=self.batch_size,
            max_grad_norm=max_grad_norm,
            max_deviations=max_deviations,
            standardize=standardize,
            **kwargs,
        )


#: drbayes's small-UCI recipes (000 Sec. IV-B; drbayes ``run_ucismall.sh``).
DRBAYES_RECIPES: dict[str, TrainingRecipe] = {
    "boston": TrainingRecipe(300, 30, 1e-3, 1e-1, 200),
    "concrete": TrainingRecipe(1000, 100, 1e-3, 1e-2, 500),
    "energy": TrainingRecipe(1000, 100, 1e-3, 1e-1, 500),
    "naval": TrainingRecipe(1000, 100, 5e-4, 1e-4, 500),
    "yacht": TrainingRecipe(1000, 30, 1e-3, 1e-1, 500),
}
#: The recipe of the earlier gpext protocol (any data set).
GPEXT_RECIPE = TrainingRecipe(200, None, 1e-2, 1e-3, 100, swa_lr=5e-3)


def training_recipe(dataset: str | None = None) -> TrainingRecipe:
    """drbayes's recipe of a data set (:data:`DRBAYES_RECIPES`), else :data:`GPEXT_RECIPE`.

    Example:
        >>> training_recipe("naval").lr, training_recipe("kin8nm") == GPEXT_RECIPE
        (0.0005, True)
    """
    return DRBAYES_RECIPES.get(dataset, GPEXT_RECIPE) if dataset is not None else GPEXT_RECIPE


def recipe_candidates(dataset: str | None = None) -> dict[str, TrainingRecipe]:
    """The recipes :func:`select_recipe` chooses from for a data set.

    ``"drbayes"`` (:data:`DRBAYES_RECIPES`) where drbayes ran the data set, and always
    ``"gpext"`` (:data:`GPEXT_RECIPE`).

    Example:
        >>> list(recipe_candidates("yacht")), list(recipe_candidates("kin8nm"))
        (['drbayes', 'gpext'], ['gpext'])
    """
    out = {}
    if dataset in DRBAYES_RECIPES:
        out["drbayes"] = DRBAYES_RECIPES[dataset]
    out["gpext"] = GPEXT_RECIPE
    return out


class RecipeSelection(NamedTuple):
    """The held-out choice between candidate training recipes (:func:`select_recipe`).

    Attributes:
        name: The chosen candidate.
        scores: Held-out score per candidate (higher is better; ``-inf`` for a candidate whose
            scoring failed with a gpext error).
        seconds: Time of the whole search.
        results: What the scorer returned besides the score, per candidate (e.g. the trained
            run), so that the winner need not be trained again.
    """

    name: str
    scores: dict[str, float]
    seconds: float
    results: dict[str, Any] | None = None


def select_recipe(
    candidates: Mapping[str, TrainingRecipe] | Sequence[TrainingRecipe],
    score: Callable[[str, TrainingRecipe], float | tuple[float, Any]],
) -> RecipeSelection:
    r"""Score every candidate recipe and keep the best: :math:`\arg\max_k s(k)`.

    ``score(name, recipe)`` trains a network with the recipe on the fit rows and returns its
    held-out score (usually the mean held-out log predictive density of a weight posterior,
    :func:`~gpext.subspace.validation_log_likelihood`), or ``(score, result)`` to keep what it
    trained in :attr:`RecipeSelection.results`. A gpext error or a non-finite score counts as
    :math:`-\infty`; ties go to the earlier candidate.

    Args:
        candidates: Named recipes (a sequence is named ``"0"``, ``"1"``, ...).
        score: The scoring function.

    Returns:
        The :class:`RecipeSelection`.

    Raises:
        InputDataError: Without candidates, or if every candidate scored :math:`-\infty`.

    Example:
        >>> sel = select_recipe(recipe_candidates("yacht"), lambda name, r: -r.weight_decay)
        >>> sel.name
        'gpext'
    """
    if not isinstance(candidates, Mapping):
        candidates = {str(i): r for i, r in enumerate(candidates)}
    if not candidates or not all(isinstance(r, TrainingRecipe) for r in candidates.values()):
        raise InputDataError(
            expected_got("select_recipe.candidates", "one or more TrainingRecipe", candidates)
        )
    t0 = time.perf_counter()
    scores: dict[str, float] = {}
    results: dict[str, Any] = {}
    for name, recipe in candidates.items():
        try:
            out = score(name, recipe)
        except GpextError:
            scores[name], results[name] = -math.inf, None
            continue
        value, result = out if isinstance(out, tuple) else (out, None)
        value = float(value)
        scores[name] = value if math.isfinite(value) else -math.inf
        results[name] = result
    best = max(scores, key=lambda k: scores[k])
    if scores[best] == -math.inf:
        raise InputDataError(
            f"select_recipe: every candidate scored -inf or failed ({scores}); check the data, "
            "the held-out rows and the recipes."
        )
    return RecipeSelection(best, scores, time.perf_counter() - t0, results)
