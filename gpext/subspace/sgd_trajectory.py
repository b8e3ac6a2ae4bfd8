"""Train a network with SGD and collect its SWA trajectory (000 Algorithm 2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, NumericalError, ShapeError, expected_got
from gpext.fit import check_explained_variance, minibatch_indices
from gpext.fit.diagnostics import NETWORK_FIT_ADVICE
from gpext.subspace.batch_norm import has_batch_norm
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.utils import check_positive_int, progress_bar

__all__ = ["train_sgd_trajectory"]


def train_sgd_trajectory(
    module: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
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

    Args:
        module: The network (trained in place).
        x: Training inputs. # shape: (N, ...)
        y: Training targets. # shape: (N,)
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
        generator: Random generator of the mini-batch order.
        show_progress: Progress bar over epochs.

    Returns:
        The :class:`TrajectoryCollector`.

    Raises:
        InputDataError: If ``swa_start >= epochs``.
        ShapeError: If ``x`` and ``y`` differ in rows, or a batch-norm network gets one row.
        NumericalError: If the loss becomes non-finite.
    """
    epochs = check_positive_int(epochs, "train_sgd_trajectory.epochs")
    swa_start = check_positive_int(swa_start, "train_sgd_trajectory.swa_start", minimum=0)
    if swa_start >= epochs:
        raise InputDataError(
            expected_got("train_sgd_trajectory.swa_start", f"< epochs={epochs}", swa_start)
        )
    n = x.shape[0]
    if y.shape[0] != n or n == 0:
        raise ShapeError(
            expected_got(
                "train_sgd_trajectory(x, y)",
                "equal, non-zero numbers of rows",
                (tuple(x.shape), tuple(y.shape)),
            )
        )
    bs = -(-n // 10) if batch_size is None else min(check_positive_int(batch_size, "batch_size"), n)
    min_size = 2 if has_batch_norm(module) else 1
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
    swa_lr = lr / 2 if swa_lr is None else swa_lr
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise InputDataError(
            expected_got(
                "train_sgd_trajectory.max_grad_norm", "a number > 0 or None", max_grad_norm
            )
        )
    collector = TrajectoryCollector(module, max_deviations=max_deviations, collect_every=every)
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    learn_noise = likelihood.learns_noise
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
        for idx in minibatch_indices(
            n, bs, generator=generator, device=x.device, min_size=min_size
        ):
            out = module(x[idx])
            loss = -likelihood.log_prob(out, y[idx]).mean()
            if learn_noise:
                with torch.no_grad():
                    mean, _ = likelihood.mean_variance(out)
                    sq_residuals += float(((y[idx] - mean) ** 2).sum())
                    rows += idx.shape[0]
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
                dev = collector.step()
                if dev is not None:
                    w = collector.flat.flatten()
                    for obs in observers:
                        obs(w, dev)
        if learn_noise and rows > 0 and math.isfinite(sq_residuals):
            likelihood.noise_variance = max(sq_residuals / rows, likelihood.min_variance, 1e-300)
    module.eval()
    if learn_noise:
        # the maximum-likelihood noise at the SWA mean, the centre of every posterior built
        # from the trajectory
        swa = collector.mean if collector.num_collected > 0 else collector.flat.flatten()
        with torch.no_grad():
            out = torch.cat([collector.flat.functional_call(swa.to(x.dtype), x[i : i + 4096])
                             for i in range(0, n, 4096)])  # fmt: skip
        likelihood.fit_noise(out, y)
    if likelihood.is_regression and y.dim() == 1:
        # a network that settled on the targets' mean must not pass silently
        sub = slice(0, min(n, 4096))
        with torch.no_grad():
            mean, _ = likelihood.mean_variance(module(x[sub]))
        check_explained_variance(mean.reshape(-1), y[sub].reshape(-1).to(mean),
                                 name="train_sgd_trajectory (last iterate)", stacklevel=2,
                                 advice=NETWORK_FIT_ADVICE)  # fmt: skip
    return collector
