"""A post-hoc start: an SWA trajectory collected from a user's pretrained network."""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from gpext.errors import InputDataError, NumericalError, ShapeError, expected_got
from gpext.subspace.data import _is_loader, _reject_loader
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.sgd_trajectory import (
    _check_loader_args,
    _fit_noise_streamed,
    _standardize_data,
    _training_batches,
    train_sgd_trajectory,
)
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.utils import check_positive_int

__all__ = ["POST_HOC_LEARNING_RATES", "collect_from_pretrained", "mean_negative_log_likelihood"]

#: Candidate constant rates of :func:`collect_from_pretrained`, tried largest first.
POST_HOC_LEARNING_RATES = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4)


@torch.no_grad()
def mean_negative_log_likelihood(
    module: nn.Module,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    likelihood: OutputLikelihood,
    *,
    batch_size: int = 4096,
) -> float:
    r""":math:`-\frac1N\sum_n \log p(y_n \mid f_w(x_n))` of a network in eval mode.

    ``x`` may be a loader of ``(x_b, y_b, ...)`` batches (e.g. a
    :class:`torch.utils.data.DataLoader`; :mod:`gpext.subspace.data`) with ``y=None``: the sum
    is streamed over its batches (moved to the module's device), :math:`N` counted on the
    way, in memory of one batch.

    Args:
        module: The network.
        x: Inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Targets (``None`` with a loader). # shape: (N,)
        likelihood: Output likelihood.
        batch_size: Rows per forward pass (tensor inputs).

    Returns:
        The mean negative log-likelihood.

    Raises:
        InputDataError: With a loader: ``y`` given, an empty loader or non-finite values.
        InputTypeError: With a loader: batches that are not ``(x, y)`` pairs of tensors.
    """
    was_training = module.training
    module.eval()
    try:
        if _is_loader(x):
            _check_loader_args(x, y, None, what="mean_negative_log_likelihood")
            total, rows = 0.0, 0
            for xb, yb in _training_batches(x, module, "mean_negative_log_likelihood(x)"):
                total += float(-likelihood.log_prob(module(xb), yb).sum())
                rows += xb.shape[0]
            return total / rows
        total = sum(
            float(-likelihood.log_prob(module(x[i : i + batch_size]), y[i : i + batch_size]).sum())
            for i in range(0, x.shape[0], batch_size)
        )
    finally:
        module.train(was_training)
    return total / x.shape[0]


def collect_from_pretrained(
    module: nn.Module,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    likelihood: OutputLikelihood,
    *,
    epochs: int = 20,
    lr: float | None = None,
    lr_candidates: Sequence[float] = POST_HOC_LEARNING_RATES,
    tolerance: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    batch_size: int | None = None,
    max_deviations: int = 20,
    max_grad_norm: float | None = 10.0,
    generator: torch.Generator | None = None,
    parameters: ParameterSelection = "all",
    standardize: bool | str = False,
    **kwargs: Any,
) -> TrajectoryCollector:
    r"""Collect a short constant-rate SGD (SWA) trajectory starting from pretrained weights.

    The post-hoc recipe: whatever optimiser trained ``module`` (Adam, L-BFGS, SGD with a
    schedule), its weights :math:`w_0` are taken as a point in a good basin, and SGD with
    momentum at a constant rate :math:`\eta` explores the basin around it for ``epochs``
    epochs, one collection per epoch (Maddox et al. 2019 start SWAG from pretrained networks in
    the same way):

    .. math::

        w_{t+1} = w_t - \eta\, \big(\nabla \mathcal L(w_t) + \text{momentum}\big), \qquad
        \mathcal L(w) = -\frac1B \sum_{n \in \mathcal B} \log p(y_n \mid f_w(x_n))
            + \frac{\lambda}{2}\|w\|^2 .

    The rate matters most: too small and the trajectory has no spread, too large and it
    leaves the basin. With ``lr=None`` it is the largest of ``lr_candidates`` whose one-epoch
    trial (on a copy, from :math:`w_0`, with the same mini-batch order) ends with a mean
    training negative log-likelihood at most ``tolerance`` nats per point above that of
    :math:`w_0`, :math:`\mathcal L_1(\eta) \le \mathcal L(w_0) + \text{tolerance}`
    (:func:`mean_negative_log_likelihood`); the smallest candidate if none passes. Then the
    collecting run starts again from :math:`w_0` (``module`` is trained in place). For a
    ``"homoscedastic_gaussian"`` likelihood the noise is first set to the maximum-likelihood
    value of :math:`w_0` (:meth:`OutputLikelihood.fit_noise`) and then learned as in
    :func:`~gpext.subspace.train_sgd_trajectory`. Build SWAG
    (:meth:`SWAG.from_trajectory <gpext.subspace.SWAG.from_trajectory>`), a PCA subspace or
    any other weight posterior from the returned collector, and tune it on held-out rows
    (:mod:`gpext.subspace.tuning`).

    Data loaders: ``x`` may be any loader of ``(x_b, y_b, ...)`` batches (e.g. a
    :class:`torch.utils.data.DataLoader`; :mod:`gpext.subspace.data`) with ``y=None``, as in
    :func:`~gpext.subspace.train_sgd_trajectory`, which runs every epoch (one step per batch,
    the loader's batch size and order; ``batch_size`` must be ``None`` and ``generator`` orders
    no batches).  The mean training NLL of the rate rule and the starting noise of a learned
    homoscedastic likelihood are streamed sums over the batches; the loader is read several
    times (once per trial epoch and NLL, once per collecting epoch), so it must be re-iterable.
    Tensors keep the behaviour above unchanged.

    Args:
        module: The pretrained network (trained in place).
        x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Training targets (``None`` with a loader). # shape: (N,)
        likelihood: Output likelihood of the network.
        epochs: Collecting epochs (at least 2; 20 gives the 20 deviations of a rank-20
            subspace).
        lr: Constant rate :math:`\eta` (``None``: chosen as above).
        lr_candidates: Rates tried when ``lr`` is ``None``.
        tolerance: Allowed increase of the mean training NLL after one epoch (nats per point).
        momentum: SGD momentum.
        weight_decay: :math:`\lambda` (0: the pretrained objective may have had none).
        batch_size: Mini-batch size (default ``ceil(N / 10)``; ``None`` with a loader).
        max_deviations: Deviation buffer size ``K``.
        max_grad_norm: Gradient clipping norm (``None``: none).
        generator: Random generator of the mini-batch order (tensor inputs).
        parameters: Which parameters are collected (see
            :func:`~gpext.subspace.train_sgd_trajectory`: all trainable parameters are trained,
            only the selected ones collected; e.g. ``"last_layer"``).
        standardize: The data contract of :func:`~gpext.subspace.train_sgd_trajectory`.
            Default ``False``: the pretrained network and its likelihood are used in the units
            they were trained in (a network trained by
            :func:`~gpext.subspace.train_sgd_trajectory` already carries its input
            standardisation, and its likelihood its target transform).  ``True`` (or
            ``"inputs"`` / ``"targets"``) fits what is missing on ``x`` and ``y`` first, for a
            network pretrained on standardised data.
        **kwargs: Passed to :func:`~gpext.subspace.train_sgd_trajectory` (``observers``,
            ``step_observers``, ``collect_every``, ``show_progress``).

    Returns:
        The :class:`~gpext.subspace.TrajectoryCollector` (``collector.post_hoc_lr`` holds
        :math:`\eta`; ``collector.post_hoc_lr_trials`` the one-epoch trials of the rate search
        in order, each a dict with ``lr``, the training ``nll`` after it, ``accepted``, the
        ``warnings`` it raised and, for a trial that failed numerically, ``error``; empty when
        ``lr`` was given).

    Raises:
        InputDataError: For ``epochs < 2``, a non-positive rate or tolerance; with a loader:
            ``y`` or ``batch_size`` given, an empty loader or non-finite values.
        InputTypeError: For a one-shot iterator (a generator) in place of a loader, a loader
            as ``y``, or batches that are not ``(x, y)`` tuples of tensors.
        ShapeError: If ``x`` and ``y`` differ in rows.
        NumericalError: If the pretrained network's training NLL is not finite.

    Example:
        >>> net = MLP(3, [50], 1)  # doctest: +SKIP
        >>> ...  # train it with Adam  # doctest: +SKIP
        >>> lik = OutputLikelihood("homoscedastic_gaussian")  # doctest: +SKIP
        >>> traj = collect_from_pretrained(net, x, y, lik)  # doctest: +SKIP
        >>> swag = SWAG.from_trajectory(traj)  # doctest: +SKIP
    """
    epochs = check_positive_int(epochs, "collect_from_pretrained.epochs", minimum=2)
    loader = _is_loader(x)
    if loader:
        _check_loader_args(x, y, batch_size, what="collect_from_pretrained")
    else:
        _reject_loader(y, "collect_from_pretrained(y)", "Pass the targets as a tensor, or a "
                       "loader of (x, y) batches as x and y=None.")  # fmt: skip
    if not loader and (x.shape[0] != y.shape[0] or x.shape[0] == 0):
        raise ShapeError(
            expected_got("collect_from_pretrained(x, y)", "equal, non-zero numbers of rows",
                         (tuple(x.shape), tuple(y.shape)))
        )  # fmt: skip
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise InputDataError(
            expected_got("collect_from_pretrained.tolerance", "a number > 0", tolerance)
        )
    rates = [float(r) for r in ([lr] if lr is not None else lr_candidates)]
    if not rates or not all(math.isfinite(r) and r > 0 for r in rates):
        raise InputDataError(
            expected_got("collect_from_pretrained.lr / lr_candidates", "positive rates",
                         lr if lr is not None else lr_candidates)
        )  # fmt: skip
    _standardize_data(module, x, y, likelihood, standardize, loader,
                      name="collect_from_pretrained")  # fmt: skip
    if likelihood.learns_noise:
        with torch.no_grad():
            module.eval()
            if loader:
                flat = FlatParameters(module)
                _fit_noise_streamed(flat, flat.flatten(), x, module, likelihood,
                                    name="collect_from_pretrained(x)")  # fmt: skip
            else:
                likelihood.fit_noise(torch.cat([module(x[i : i + 4096])
                                                for i in range(0, x.shape[0], 4096)]), y)  # fmt: skip
    common = {
        "momentum": momentum,
        "weight_decay": weight_decay,
        "batch_size": batch_size,
        "max_grad_norm": max_grad_norm,
    }
    trials: list[dict] = []
    if lr is None:
        start_nll = mean_negative_log_likelihood(module, x, y, likelihood)
        if not math.isfinite(start_nll):
            raise NumericalError(
                "collect_from_pretrained: the pretrained network's training NLL is not finite; "
                "check the network, the data and the likelihood."
            )
        chosen = min(rates)
        seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
        for rate in sorted(rates, reverse=True):
            trial, trial_lik = copy.deepcopy(module), copy.deepcopy(likelihood)
            record = {"lr": rate, "nll": math.nan, "accepted": False, "warnings": []}
            trials.append(record)
            # A one-epoch trial warns as a matter of course (e.g. about a single collection);
            # its warnings are recorded with the trial instead of being shown or dropped.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    train_sgd_trajectory(
                        trial, x, y, trial_lik, epochs=1, swa_start=0, lr=rate, swa_lr=rate,
                        generator=torch.Generator(device="cpu").manual_seed(seed),
                        show_progress=False, standardize=False, **common,
                    )  # fmt: skip
                except NumericalError as err:
                    record["error"] = str(err)
            record["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
            if "error" in record:
                continue
            record["nll"] = mean_negative_log_likelihood(trial, x, y, trial_lik)
            if record["nll"] <= start_nll + tolerance:
                record["accepted"] = True
                chosen = rate
                break
        lr = chosen
    traj = train_sgd_trajectory(
        module, x, y, likelihood, epochs=epochs, swa_start=0, lr=lr, swa_lr=lr,
        max_deviations=max_deviations, generator=generator, parameters=parameters,
        standardize=False, **common, **kwargs,
    )  # fmt: skip
    traj.post_hoc_lr = float(lr)
    traj.post_hoc_lr_trials = trials
    return traj
