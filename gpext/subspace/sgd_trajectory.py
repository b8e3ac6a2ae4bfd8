"""Train a network with SGD and collect its SWA trajectory (000 Algorithm 2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, NumericalError, ShapeError, expected_got
from gpext.fit import check_explained_variance, minibatch_indices
from gpext.fit.diagnostics import NETWORK_FIT_ADVICE
from gpext.nn.input_standardization import input_standardization, standardize_inputs
from gpext.subspace.batch_norm import has_batch_norm
from gpext.subspace.data import (
    _check_reiterable,
    _evaluation_error,
    _first_rows,
    _is_loader,
    _iter_batches,
    _merge_single_rows,
    _reject_loader,
)
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.utils import check_learning_rate, check_positive_int, progress_bar

__all__ = ["STANDARDIZE_LOADER_ROWS", "train_sgd_trajectory"]

#: Rows of a loader (the first ones it yields) on which the data standardisation is fitted.
STANDARDIZE_LOADER_ROWS = 10_000


def train_sgd_trajectory(
    module: nn.Module,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    likelihood: OutputLikelihood,
    *,
    epochs: int,
    swa_start: int,
    lr: float = 1e-2,
    swa_lr: float | None = None,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    batch_size: int | None = None,
    collect_every: int | None = None,
    max_deviations: int = 20,
    max_grad_norm: float | None = None,
    observers: Sequence[Callable[[torch.Tensor, torch.Tensor], object]] = (),
    step_observers: Sequence[Callable[[torch.Tensor], object]] = (),
    generator: torch.Generator | None = None,
    show_progress: bool | None = None,
    parameters: ParameterSelection = "all",
    standardize: bool | str = True,
) -> TrajectoryCollector:
    r"""SGD on the negative mean log-likelihood, then constant-rate SWA collection.

    Epochs ``0 .. swa_start - 1`` use learning rate ``lr`` (cosine-decayed towards ``swa_lr``);
    from epoch ``swa_start`` on the rate is ``swa_lr`` and the weights are collected every
    ``collect_every`` optimiser steps (default: once per epoch) into a
    :class:`TrajectoryCollector`. Each observer is called as ``observer(weights, deviation)`` at
    every collection, which is how :class:`InKPCASubspace` and :class:`OnlineFactorAnalysis`
    are updated in arrival order.

    .. math::

        \mathcal{L}(w) = -\frac1N \sum_n \log p(y_n \mid f_w(x_n)) + \frac{\lambda}{2}\|w\|^2

    Learned homoscedastic noise (``OutputLikelihood("homoscedastic_gaussian")``): the noise
    variance is learned jointly with the weights by block coordinate ascent on the
    log-likelihood. The weights take SGD steps at the current :math:`\sigma^2`; after every
    epoch :math:`\sigma^2` is set to its exact maximiser given the epoch's residuals,
    :math:`\sigma^2 \leftarrow \frac{1}{N}\sum_n (y_n - \mu_n)^2` (each :math:`\mu_n` from
    the forward pass of its mini-batch), and after training to the maximum-likelihood value at
    the SWA mean :math:`\bar w` on all training rows (:meth:`OutputLikelihood.fit_noise`), the
    centre of every posterior built from the trajectory, whose residuals the likelihood of ESS
    and VI describes (it can differ from the last iterate's either way); this training-row
    value tends to be too large for a Bayesian model average, whose weight spread already
    covers part of the residuals: tune it on held-out rows
    (:func:`~gpext.subspace.select_noise_variance`, :func:`~gpext.subspace.select_swag_scale`);
    the likelihood object is updated in place. This keeps the noise away from the optimiser's
    weight decay and momentum and needs one extra forward pass, at the end. As the noise
    shrinks the gradient of the mean grows like :math:`1 / \sigma^2` (as a heteroscedastic
    head's does): pass ``max_grad_norm`` (the recipes use 10; on energy, split 0, without it a
    homoscedastic network at ``lr = 1e-2`` ended at test RMSE 2.3 standard deviations of the
    target, with it at 0.39).

    Data contract (``standardize``, default on; :class:`gpext.fit.Standardizer`): before
    training, the network gets an input standardisation fitted on the training inputs
    (:func:`gpext.nn.standardize_inputs`: buffers and a forward pre-hook, no parameters, so
    the flat weights, SWAG, subspaces and batch-norm refreshes are unchanged) unless it
    already carries a fitted one, and a regression likelihood gets a target transform fitted
    on the training targets (:meth:`OutputLikelihood.fit_target_transform`) unless it already
    has one.  The network then trains on inputs and targets with zero mean and unit spread
    whatever their units, so ``lr``, ``weight_decay``, the initial noise and the recipes hold
    for any table, and every prediction read through the likelihood
    (:meth:`OutputLikelihood.mean_variance`, :func:`~gpext.subspace.predict_weight_samples`,
    :class:`~gpext.subspace.SubspaceModel`) is in the targets' units.  A likelihood shared by
    several networks keeps the transform of the first training.  ``standardize=False`` uses
    the data as given (the earlier behaviour; e.g. data already on a unit scale, or to
    continue training a network with its likelihood as they are); ``"inputs"`` or
    ``"targets"`` standardise only those (e.g. when a BoTorch transform already handles the
    other).  With a loader the statistics come from the first
    :data:`STANDARDIZE_LOADER_ROWS` rows it yields in the first epoch (all rows of a smaller
    loader; those batches are held back until then, so the loader is not read an extra
    time): shuffle a loader whose order is not random.

    Data loaders: ``x`` may be a loader of ``(x_b, y_b, ...)`` batches (e.g. a
    :class:`torch.utils.data.DataLoader`; :mod:`gpext.subspace.data`) with ``y=None``. Each
    epoch iterates the loader once, one optimiser step per batch, with the loader's batch size
    and order (``batch_size`` must then be ``None`` and ``generator`` is not used; a one-row
    batch of a batch-norm network is merged into its neighbour); batches are moved to the
    module's device.  ``collect_every`` still counts optimiser steps; without it the weights
    are collected once at the end of every collecting epoch.  The learned noise's per-epoch
    update sums the squared residuals over the batches, and its final value at the SWA mean
    takes one more pass (:math:`\frac1N \sum_b \sum_{n \in b} (y_n - \mu_n)^2`); the
    check that the last iterate explains the targets reads the first 4096 rows the loader
    yields.  Tensors keep the behaviour above unchanged.

    Args:
        module: The network (trained in place).
        x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Training targets (``None`` with a loader). # shape: (N,)
        likelihood: Output likelihood (a ``"homoscedastic_gaussian"`` one is updated in place).
        epochs: Total epochs.
        swa_start: First collecting epoch (``< epochs``).
        lr: Initial learning rate.
        swa_lr: Constant rate of the collection phase (default ``lr / 2``).
        momentum: SGD momentum.
        weight_decay: :math:`\lambda`.
        batch_size: Mini-batch size (default ``ceil(N / 10)``, the drbayes UCI choice). For a
            network with batch norm, a last mini-batch of one row (``N mod batch_size == 1``)
            is merged into the one before it (batch norm has no batch variance for one row),
            as :func:`gpext.fit.minibatch_indices` does with ``min_size=2``.
        collect_every: Collection period in optimiser steps (default: steps per epoch).
        max_deviations: Deviation buffer size ``K``.
        max_grad_norm: Clip the gradient to this Euclidean norm before each step (``None``: no
            clipping). A heteroscedastic Gaussian NLL has gradients that grow like
            :math:`1/\sigma^2(x)` when the predicted variance collapses; one such step throws
            the weights to another region, and the SWA mean of a trajectory with such a jump
            averages two unrelated solutions. Clipping keeps the trajectory in one basin.
        observers: Callables notified at each collection.
        step_observers: Callables called as ``observer(weights)`` after every optimiser step of
            the collection phase (e.g. :meth:`OnlineFactorAnalysis.update`, which wants many
            iterates).
        generator: Random generator of the mini-batch order (tensor inputs).
        show_progress: Progress bar over epochs.
        parameters: Which parameters are collected (:class:`~gpext.subspace.FlatParameters`:
            ``"all"``, ``"requires_grad"``, ``"last_layer"``, names or a predicate).  Every
            trainable parameter is still optimised ("optimise all, collect selected", as
            laplace-torch's last-layer approximation trains the whole network); only the
            selected ones enter the collector, its observers and step observers, whose
            vectors have the selected length :math:`D`.  Freeze parameters
            (``requires_grad_(False)``) to keep them out of the optimisation as well.
        standardize: The data contract above: ``True`` (inputs and regression targets),
            ``"inputs"``, ``"targets"`` or ``False``.

    Returns:
        The :class:`TrajectoryCollector`.

    Raises:
        InputDataError: If ``swa_start >= epochs``, or ``standardize`` is not one of the
            four values; with a loader: ``y`` or ``batch_size``
            given, an empty loader, non-finite values, or batches the network cannot evaluate.
        InputTypeError: For a one-shot iterator (a generator) or batches that are not
            ``(x, y)`` tuples of tensors.
        ShapeError: If ``x`` and ``y`` differ in rows, or a batch-norm network gets one row.
        NumericalError: If the loss becomes non-finite.
    """
    epochs = check_positive_int(epochs, "train_sgd_trajectory.epochs")
    # 0 is allowed: a frozen network (e.g. to fit only a learned noise)
    lr = check_learning_rate(lr, "train_sgd_trajectory.lr", allow_zero=True)
    swa_lr = check_learning_rate(swa_lr, "train_sgd_trajectory.swa_lr", allow_none=True,
                                 allow_zero=True)  # fmt: skip
    swa_start = check_positive_int(swa_start, "train_sgd_trajectory.swa_start", minimum=0)
    if swa_start >= epochs:
        raise InputDataError(
            expected_got("train_sgd_trajectory.swa_start", f"< epochs={epochs}", swa_start)
        )
    loader = _is_loader(x)
    min_size = 2 if has_batch_norm(module) else 1
    if loader:
        _check_loader_args(x, y, batch_size)
        n = None
        every = (
            None if collect_every is None else check_positive_int(collect_every, "collect_every")
        )
    else:
        _reject_loader(y, "train_sgd_trajectory(y)", "Pass the targets as a tensor, or a loader "
                       "of (x, y) batches as x and y=None.")  # fmt: skip
        n = x.shape[0]
        if y is None or y.shape[0] != n or n == 0:
            raise ShapeError(
                expected_got(
                    "train_sgd_trajectory(x, y)",
                    "equal, non-zero numbers of rows",
                    (tuple(x.shape), None if y is None else tuple(y.shape)),
                )
            )
        bs = (
            -(-n // 10)
            if batch_size is None
            else min(check_positive_int(batch_size, "batch_size"), n)
        )
        if n < min_size:
            raise ShapeError(
                expected_got(
                    "train_sgd_trajectory(x)",
                    "at least 2 rows for a network with batch norm (no batch variance for one row)",
                    tuple(x.shape),
                )
            )
        steps_per_epoch = -(-n // bs) - (1 if min_size == 2 and n > bs and n % bs == 1 else 0)
        every = (
            steps_per_epoch
            if collect_every is None
            else check_positive_int(collect_every, "collect_every")
        )
    # tensors: fitted now; a loader: on the first rows of the first epoch (no extra pass)
    pending_fit = _standardize_data(module, x, y, likelihood, standardize, loader, defer=True)
    # a loader without collect_every: one collection at the end of every epoch
    per_epoch = every is None
    swa_lr = lr / 2 if swa_lr is None else swa_lr
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise InputDataError(
            expected_got(
                "train_sgd_trajectory.max_grad_norm", "a number > 0 or None", max_grad_norm
            )
        )
    collector = TrajectoryCollector(
        module,
        max_deviations=max_deviations,
        collect_every=every or _sized(x) or 1,
        parameters=parameters,
    )
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    learn_noise = likelihood.learns_noise

    def epoch_batches():
        if not loader:
            for idx in minibatch_indices(
                n, bs, generator=generator, device=x.device, min_size=min_size
            ):
                yield x[idx], y[idx]
            return
        batches = _training_batches(x, module, "train_sgd_trajectory(x)")
        if pending_fit is not None:
            batches = _fitted_on_first_rows(batches, pending_fit)
        for xb, yb in _merge_single_rows(batches) if min_size == 2 else batches:
            if xb.shape[0] < min_size:
                raise ShapeError(
                    expected_got(
                        "train_sgd_trajectory(x)",
                        "at least 2 rows for a network with batch norm (no batch variance for "
                        "one row)", f"a loader of one row, inputs of shape {tuple(xb.shape)}",
                    )
                )  # fmt: skip
            yield xb, yb

    def notify(dev: torch.Tensor | None) -> None:
        if dev is not None:
            w = collector.flat.flatten()
            for obs in observers:
                obs(w, dev)

    module.train()
    for epoch in progress_bar(range(epochs), desc="SGD/SWA", show=show_progress):
        if epoch < swa_start:
            frac = epoch / max(swa_start, 1)
            rate = swa_lr + 0.5 * (lr - swa_lr) * (
                1 + torch.cos(torch.tensor(frac * torch.pi)).item()
            )
        else:
            rate = swa_lr
        for group in opt.param_groups:
            group["lr"] = rate
        sq_residuals, rows = 0.0, 0
        for xb, yb in epoch_batches():
            pending_fit = None  # fitted on the first epoch's first rows
            out = module(xb) if not loader else _forward(module, xb, "train_sgd_trajectory(x)")
            loss = -likelihood.log_prob(out, yb).mean()
            if learn_noise:  # standardised units, as the noise variance
                with torch.no_grad():
                    mean, _ = likelihood.standardized_mean_variance(out)
                    sq_residuals += float(((likelihood.transform_targets(yb) - mean) ** 2).sum())
                    rows += xb.shape[0]
            if not torch.isfinite(loss):
                raise NumericalError(
                    f"train_sgd_trajectory: non-finite loss at epoch {epoch}; lower lr or check the data."
                )
            opt.zero_grad()
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
            opt.step()
            if epoch >= swa_start:
                if step_observers:
                    w_step = collector.flat.flatten()
                    for obs in step_observers:
                        obs(w_step)
                if not per_epoch:
                    notify(collector.step())
        if per_epoch and epoch >= swa_start:
            notify(collector.collect())
        if learn_noise and rows > 0 and math.isfinite(sq_residuals):
            likelihood.noise_variance = max(sq_residuals / rows, likelihood.min_variance, 1e-300)
    module.eval()
    if learn_noise:
        # the maximum-likelihood noise at the SWA mean, the centre of every posterior built
        # from the trajectory
        swa = collector.mean if collector.num_collected > 0 else collector.flat.flatten()
        if loader:
            _fit_noise_streamed(collector.flat, swa, x, module, likelihood)
        else:
            with torch.no_grad():
                out = torch.cat([collector.flat.functional_call(swa.to(x.dtype), x[i : i + 4096])
                                 for i in range(0, n, 4096)])  # fmt: skip
            likelihood.fit_noise(out, y)
    if likelihood.is_regression:
        # a network that settled on the targets' mean must not pass silently
        if loader:
            x_sub, y_sub = _first_rows(_training_batches(x, module, "train_sgd_trajectory(x)"),
                                       4096)  # fmt: skip
        else:
            sub = slice(0, min(n, 4096))
            x_sub, y_sub = x[sub], y[sub]
        if y_sub.dim() == 1:
            with torch.no_grad():
                mean, _ = likelihood.mean_variance(module(x_sub))
            check_explained_variance(mean.reshape(-1), y_sub.reshape(-1).to(mean),
                                     name="train_sgd_trajectory (last iterate)", stacklevel=2,
                                     advice=NETWORK_FIT_ADVICE)  # fmt: skip
    return collector


_STANDARDIZE = (True, False, "inputs", "targets")


def _standardize_parts(standardize: object, name: str) -> tuple[bool, bool]:
    """``(inputs, targets)`` of a ``standardize`` argument (``True``, ``False``, ``"inputs"``,
    ``"targets"``)."""
    if not any(standardize is v or (isinstance(v, str) and standardize == v)
               for v in _STANDARDIZE):  # fmt: skip
        raise InputDataError(
            expected_got(name, "True, False, 'inputs' or 'targets'", repr(standardize))
        )
    return standardize in (True, "inputs"), standardize in (True, "targets")


def _standardize_data(
    module: nn.Module,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    likelihood: OutputLikelihood,
    standardize: bool | str,
    loader: bool,
    *,
    name: str = "train_sgd_trajectory",
    defer: bool = False,
) -> Callable[[torch.Tensor, torch.Tensor], None] | None:
    """Fit the input standardisation of ``module`` and the target transform of ``likelihood``
    on the training data, each unless already there (the data contract of
    :func:`train_sgd_trajectory`).

    A loader's statistics come from its first :data:`STANDARDIZE_LOADER_ROWS` rows: read now
    (one partial pass), or with ``defer`` returned as ``fit(x_rows, y_rows)`` for the caller
    to apply to the first rows of its own first pass (:func:`_fitted_on_first_rows`), so that
    a loader whose sampler draws from a shared generator sees no extra pass.  ``None`` when
    nothing is (left) to fit.
    """
    inputs, targets = _standardize_parts(standardize, f"{name}.standardize")
    inputs = inputs and input_standardization(module) is None
    targets = targets and likelihood.is_regression and not likelihood.has_target_transform
    if not (inputs or targets):
        return None

    def fit(xs: torch.Tensor, ys: torch.Tensor) -> None:
        if inputs:
            standardize_inputs(module, xs, name=name)
        if targets and ys.is_floating_point():
            likelihood.fit_target_transform(ys)

    if loader and defer:
        return fit
    if loader:
        x, y = _first_rows(_training_batches(x, module, f"{name}(x)"), STANDARDIZE_LOADER_ROWS)
    fit(x, y)
    return None


def _fitted_on_first_rows(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    fit: Callable[[torch.Tensor, torch.Tensor], None],
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches unchanged, after ``fit`` on their first :data:`STANDARDIZE_LOADER_ROWS`
    rows (the batches up to there are held back until then)."""
    head, rows = [], 0
    it = iter(batches)
    for batch in it:
        head.append(batch)
        rows += batch[0].shape[0]
        if rows >= STANDARDIZE_LOADER_ROWS:
            break
    if head:
        fit(*(torch.cat(col)[:STANDARDIZE_LOADER_ROWS] for col in zip(*head)))
    yield from head
    yield from it


def _sized(data: object) -> int | None:
    """``len(data)`` when the loader has one (a DataLoader's number of batches)."""
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check_loader_args(
    loader: object, y: object, batch_size: int | None, *, what: str = "train_sgd_trajectory"
) -> None:
    """Arguments that a loader ``x`` excludes: ``y``, ``batch_size``; one-shot iterators.

    ``what`` names the calling function in the messages.
    """
    if y is not None:
        raise InputDataError(
            expected_got(f"{what}(y)", "None when x is a loader of (x, y) batches",
                         type(y).__name__, "Drop y: the loader yields the targets.")
        )  # fmt: skip
    if batch_size is not None:
        raise InputDataError(
            expected_got(f"{what}.batch_size", "None when x is a loader",
                         batch_size, "Set the batch size in the loader.")
        )  # fmt: skip
    # read once per epoch, and again for the learned noise and the final check
    _check_reiterable(loader, f"{what}(x)")


def _training_batches(loader: object, module: nn.Module, name: str):
    """Checked ``(x_b, y_b)`` batches of a loader, moved to the module's device."""
    device = next(module.parameters()).device
    return _iter_batches(loader, name, targets=True,
                         convert=lambda xb, yb: (xb.to(device), yb.to(device)))  # fmt: skip


def _forward(module: nn.Module, xb: torch.Tensor, name: str) -> torch.Tensor:
    """``module(x_b)``, with a gpext error when the network cannot evaluate the batch."""
    try:
        return module(xb)
    except (RuntimeError, ValueError, TypeError, IndexError) as err:
        raise _evaluation_error(
            name, "batches the network can evaluate", xb, err,
            "Make the loader yield inputs shaped (B, ...) in the network's dtype.",
        ) from err  # fmt: skip


@torch.no_grad()
def _fit_noise_streamed(
    flat: FlatParameters,
    w: torch.Tensor,
    loader: object,
    module: nn.Module,
    likelihood: OutputLikelihood,
    *,
    name: str = "train_sgd_trajectory(x)",
) -> None:
    r""":meth:`OutputLikelihood.fit_noise` over a loader: :math:`\frac1N\sum_b \sum_{n \in b} (t_n - m_n)^2`

    (standardised units, as :meth:`OutputLikelihood.fit_noise`)."""
    total, rows = 0.0, 0
    for xb, yb in _training_batches(loader, module, name):
        out = flat.functional_call(w.to(xb.dtype), xb)
        mean, _ = likelihood.standardized_mean_variance(out)
        if mean.shape != yb.shape:
            raise ShapeError(
                expected_got(f"{name} targets", f"shape {tuple(mean.shape)}",
                             tuple(yb.shape))
            )  # fmt: skip
        total += float(((likelihood.transform_targets(yb.to(mean)) - mean) ** 2).double().sum())
        rows += yb.shape[0]
    value = total / rows
    if not math.isfinite(value):
        raise InputDataError(
            f"{name}: non-finite residuals at the network's weights; check the network and targets."
        )
    likelihood.noise_variance = max(value, likelihood.min_variance, 1e-300)
