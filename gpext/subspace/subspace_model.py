"""Bayesian inference over a weight subspace :math:`w = \\hat w + P^\\top\\theta` (000 Eq. 1-6, 9-10)."""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from gpext.errors import (
    ConvergenceWarning,
    FitError,
    InputDataError,
    InputTypeError,
    NotFittedError,
    OptimizerStallWarning,
    ShapeError,
    expected_got,
)
from gpext.fit import (
    FitResult,
    HeldoutCheck,
    StopReason,
    TemperatureSelection,
    check_explained_variance,
    minibatch_indices,
    minimize_lbfgs,
    reference_heldout_nll,
    train_loop,
)
from gpext.metrics import mixture_gaussian_log_likelihood
from gpext.nn.input_standardization import INPUT_LOC, attach_input_standardization
from gpext.subspace.batch_norm import has_batch_norm, refresh_batch_norm
from gpext.subspace.bayesian_model_averaging import (
    check_mixture_heldout,
    predict_weight_samples,
    select_mixture_variance_scale,
)
from gpext.subspace.data import (
    _check_reiterable,
    _chunks,
    _evaluation_error,
    _first_rows,
    _is_loader,
    _MappedLoader,
    _next_batch,
    _num_rows,
    _Stream,
)
from gpext.subspace.elliptical_slice_sampler import EllipticalSliceSampler
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.mean_field_gaussian import MeanFieldGaussian
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.utils import check_finite, check_labels, check_positive_int
from gpext.utils.validation import as_model_input

__all__ = ["SubspaceModel"]


class SubspaceModel(nn.Module):
    r"""A network restricted to an affine weight subspace, with ESS and mean-field VI over it.

    .. math::

        w(\theta) = \hat w + P^\top \theta, \qquad
        p(\theta \mid \mathcal{D}) \propto \exp\Big(\frac{1}{T}\sum_{n=1}^N
            \log p(y_n \mid f_{w(\theta)}(x_n))\Big)\, \mathcal{N}(\theta; 0, \sigma_p^2 I_r)

    (000 Eq. 2-4, 9; the temperature :math:`T` tempers the likelihood against posterior
    concentration). :meth:`sample_ess` draws from it by elliptical slice sampling;
    :meth:`fit_vi` maximises the tempered ELBO (000 Eq. 5, 10)

    .. math::

        \mathcal{L}(\mu, \rho) = \frac{1}{T}\,\mathbb{E}_{q}\Big[\sum_n \log p(y_n \mid
            f_{w(\theta)}(x_n))\Big] - \mathrm{KL}\big(q \,\|\, \mathcal{N}(0, \sigma_p^2 I)\big)

    with reparameterised samples and Adam; :meth:`predict` returns per-sample predictions for
    Bayesian model averaging. The network is evaluated functionally (``torch.func``) in eval
    mode; its own parameters, buffers and train/eval mode are not changed (the mode is
    switched only while the network is evaluated, and restored afterwards).

    Inputs: ``x`` and ``y`` may be tensors, numpy arrays or Python sequences; floating inputs
    are converted to (or must be, for tensors) the dtype and device of ``center``, integer
    tensors are passed to the network as they are (e.g. token indices), and empty, non-finite
    or half-precision inputs, inputs the network cannot evaluate, or a row count that differs
    from ``y``'s are gpext errors.  Data loaders: every method that takes ``(x, y)`` also
    takes a loader of ``(x_b, y_b)`` batches as ``x`` with ``y=None`` (e.g. a
    :class:`torch.utils.data.DataLoader`; :mod:`gpext.subspace.data`), and :meth:`predict` a
    loader of input batches; each batch is converted and checked as tensors are, full-data
    log-likelihoods are sums over the batches in memory of one batch, and :meth:`fit_vi` can
    also take one batch per step (``minibatch=True``).

    Data contract: the model evaluates the network and the likelihood as they are.  A network
    trained by :func:`~gpext.subspace.train_sgd_trajectory` (default ``standardize=True``)
    standardises its own inputs (:func:`gpext.nn.standardize_inputs`) and its likelihood maps
    the outputs to the targets' units (:meth:`OutputLikelihood.mean_variance`), so ``x``,
    ``y``, the log-likelihoods and the predictions are all in the user's units, and the
    prior, the temperature grid and the VI settings act on standardised outputs whatever
    those units are.

    Save and restore: the state dict holds the network (with its input standardisation), the
    subspace, the fitted variational ``q`` (after :meth:`fit_vi`), the batch-norm statistics
    at the centre, the temperature, ``variance_scale``, the likelihood's noise and target
    transform (:meth:`OutputLikelihood.state_dict`; loading sets them on the model's
    likelihood) and the names of the selected parameters; a new instance built the same
    way (same network architecture, parameter selection, centre and projection shapes) loads
    it.

    Batch norm: the network's running statistics are those of the last SGD iterate, not of the
    centre :math:`\hat w` around which the posterior lives. For a network with batch norm,
    :meth:`sample_ess` and :meth:`fit_vi` therefore first recompute them at the centre on their
    training inputs (:meth:`refresh_batch_norm`: one pass in train mode with a cumulative
    average, on a copy of the network), and every :math:`\theta` is evaluated with those
    statistics (:attr:`bn_buffers`). :meth:`predict` uses them as well, unless ``bn_inputs``
    asks for statistics recomputed per sample; with neither it warns
    (:class:`~gpext.errors.BatchNormWarning`).

    Args:
        module: The network.
        center: Subspace centre :math:`\hat w` (usually the SWA mean). # shape: (D,)
        projection: Projection ``P``. # shape: (r, D)
        likelihood: How to read the network's output.
        prior_std: Prior standard deviation :math:`\sigma_p`.
        temperature: Likelihood temperature :math:`T`.
        parameters: Which parameters :math:`w` holds (:class:`~gpext.subspace.FlatParameters`:
            ``"all"``, ``"requires_grad"``, ``"last_layer"``, names or a predicate); ``D`` is
            their number, and the other parameters keep the network's values in every
            evaluation (e.g. a subspace of the last layer's weights, from a
            :class:`~gpext.subspace.TrajectoryCollector` built with the same selection).

    Example:
        >>> model = SubspaceModel(net, swa, pca.projection, OutputLikelihood("gaussian"))  # doctest: +SKIP
        >>> thetas = model.sample_ess(x, y, 30)                                              # doctest: +SKIP
        >>> pred = model.predict(x_test, thetas)                                             # doctest: +SKIP
    """

    def __init__(
        self,
        module: nn.Module,
        center: torch.Tensor,
        projection: torch.Tensor,
        likelihood: OutputLikelihood,
        *,
        prior_std: float = 1.0,
        temperature: float = 1.0,
        parameters: ParameterSelection = "all",
    ) -> None:
        super().__init__()
        self.flat = FlatParameters(module, parameters)
        # the user's network keeps its train/eval mode: it is switched to eval mode only while
        # it is evaluated (log_likelihood, predict) and restored afterwards
        self.module = module
        d = self.flat.num_parameters
        self.flat.check_vector(center, "SubspaceModel.center")
        if projection.dim() != 2 or projection.shape[-1] != d or projection.shape[0] < 1:
            raise ShapeError(
                expected_got("SubspaceModel.projection", f"shape (r, {d})", tuple(projection.shape))
            )
        check_finite(center, "SubspaceModel.center")
        check_finite(projection, "SubspaceModel.projection")
        if not isinstance(likelihood, OutputLikelihood):
            raise InputDataError(
                expected_got(
                    "SubspaceModel.likelihood", "an OutputLikelihood", type(likelihood).__name__
                )
            )
        if not (prior_std > 0 and temperature > 0):
            raise InputDataError(
                expected_got(
                    "SubspaceModel", "prior_std > 0 and temperature > 0", (prior_std, temperature)
                )
            )
        self.register_buffer("center", center.detach().clone())
        self.register_buffer("projection", projection.detach().to(center.dtype).clone())
        self.likelihood = likelihood
        self.prior_std = float(prior_std)
        self.temperature = float(temperature)
        #: Factor :math:`\kappa` on the predicted observation variances (regression), set by
        #: :meth:`calibrate_variance`; 1 leaves the network's variances as they are.
        self.variance_scale = 1.0
        self.variational: MeanFieldGaussian | None = None
        #: Buffers of the network with batch-norm statistics recomputed at the centre
        #: (:meth:`refresh_batch_norm`); ``None`` until then, or without batch norm.
        self.bn_buffers: dict[str, torch.Tensor] | None = None

    @torch.no_grad()
    def refresh_batch_norm(
        self, x: torch.Tensor | Iterable, *, batch_size: int = 256
    ) -> dict[str, torch.Tensor] | None:
        r"""Recompute the batch-norm statistics at the centre :math:`\hat w` on inputs ``x``.

        On a copy of the network with the centre's weights, the running statistics are reset
        and re-estimated by one pass over ``x`` (:func:`~gpext.subspace.refresh_batch_norm`).
        The copy's buffers are stored in :attr:`bn_buffers` and used by
        :meth:`log_likelihood` (hence ESS and VI) and :meth:`predict`. :meth:`sample_ess` and
        :meth:`fit_vi` call it on their training inputs.

        Args:
            x: Training inputs, or a loader of input batches (or of ``(x, y)`` batches, the
                first element taken; read once, with its own batches). # shape: (N, ...)
            batch_size: Mini-batch size of the pass (tensor inputs).

        Returns:
            :attr:`bn_buffers`, or ``None`` for a network without batch norm.
        """
        if not has_batch_norm(self.module):
            self.bn_buffers = None
            return None
        if isinstance(x, _Stream):
            x = (xb for xb, _ in x)
        elif _is_loader(x):
            x = self._input_loader(x, "SubspaceModel.refresh_batch_norm(x)")
        else:
            x = self._check_inputs(x, "SubspaceModel.refresh_batch_norm(x)")
        work = copy.deepcopy(self.module)
        self.flat.assign(self.center, work)
        refresh_batch_norm(work, x, batch_size=batch_size)
        self.bn_buffers = {name: b.detach().clone() for name, b in work.named_buffers()}
        return self.bn_buffers

    @property
    def rank(self) -> int:
        """Subspace dimension ``r``."""
        return int(self.projection.shape[0])

    def weights(self, theta: torch.Tensor) -> torch.Tensor:
        """Full weights :math:`\\hat w + P^\\top\\theta`. ``(r,) -> (D,)`` or ``(S, r) -> (S, D)``."""
        if theta.shape[-1] != self.rank or theta.dim() > 2:
            raise ShapeError(
                expected_got(
                    "SubspaceModel.weights(theta)",
                    f"shape ({self.rank},) or (S, {self.rank})",
                    tuple(theta.shape),
                )
            )
        return self.center + theta.to(self.center) @ self.projection

    def log_likelihood(
        self, theta: torch.Tensor, x: torch.Tensor | Iterable, y: torch.Tensor | None = None
    ) -> torch.Tensor:
        r"""Untempered :math:`\sum_n \log p(y_n \mid f_{w(\theta)}(x_n))` (differentiable in ``theta``).

        With a loader of ``(x_b, y_b)`` batches in place of ``(x, y)`` the sum is streamed over
        the batches, :math:`\sum_b \sum_{n \in b} \log p(y_n \mid f_{w(\theta)}(x_n))`, in
        memory of one batch: each batch's graph is freed after its gradient with respect to
        ``theta``, and the returned tensor has the exact value and first derivative (through a
        linear surrogate) but no second derivatives.  Tensors are evaluated in one pass, as
        given (no conversion or checks).

        Args:
            theta: # shape: (r,)
            x: Inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
            y: Targets (``None`` with a loader). # shape: (N,)

        Returns:
            Scalar tensor.

        Raises:
            InputDataError: With a loader: ``y`` given, an empty loader, non-finite values.
            InputTypeError: With a loader: batches that are not ``(x, y)`` pairs of tensors.
        """
        if isinstance(x, _Stream) or _is_loader(x):
            stream = self._data(x, y, "x", "y", what="SubspaceModel.log_likelihood")
            return self._stream_log_likelihoods(theta.reshape(1, -1), stream)[0]
        with _eval_mode(self.module):
            out = self.flat.functional_call(self.weights(theta), x, buffers=self.bn_buffers)
        return self.likelihood.log_prob(out, y).sum()

    def sample_ess(
        self,
        x: torch.Tensor | Iterable,
        y: torch.Tensor | None,
        num_samples: int,
        *,
        burn_in: int = 0,
        thin: int = 1,
        initial: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> torch.Tensor:
        """Elliptical slice samples of :math:`\\theta` from the tempered posterior.

        With a loader of ``(x_b, y_b)`` batches in place of ``(x, y)`` (``y=None``), every
        log-likelihood evaluation is one streamed pass over the loader (a sum over batches, see
        :meth:`log_likelihood`); with the same generator the draws equal those of the tensors
        up to the rounding of the summation order.

        Args:
            x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
            y: Training targets (``None`` with a loader). # shape: (N,)
            num_samples: Number of returned samples ``S``.
            burn_in: Transitions discarded first.
            thin: Keep every ``thin``-th state.
            initial: Initial ``theta`` (default 0, the centre).
            generator: Random generator.
            show_progress: Progress bar.

        Returns:
            Samples, on the model's device. # shape: (S, r)
        """
        x, y = self._data_pair(x, y, what="SubspaceModel.sample_ess")
        self.refresh_batch_norm(x)
        sampler = EllipticalSliceSampler(
            lambda t: self.log_likelihood(t, x, y) / self.temperature,
            self.rank,
            prior_std=self.prior_std,
            dtype=self.center.dtype,
            generator=generator,
        )
        thetas = sampler.sample(
            num_samples, initial=initial, burn_in=burn_in, thin=thin, show_progress=show_progress
        )
        return thetas.to(self.center.device)  # the default chain runs on the CPU, as its generator

    def check_fit(
        self,
        x: torch.Tensor | Iterable,
        y: torch.Tensor | None,
        thetas: torch.Tensor,
        *,
        max_points: int = 4096,
    ) -> bool:
        r"""Warn when the model average of ``thetas`` explains (almost) none of ``y``.

        For regression, :math:`R^2` of the Bayesian-model-average mean
        :math:`\frac1S\sum_s \mu(x, \theta_s)` on (up to ``max_points``) training rows,
        checked by :func:`gpext.fit.check_explained_variance`: a posterior so flat (or so hot)
        that its samples average out to the targets' mean is a degenerate fit, whatever each
        sample does.  Classification is not checked here.

        Args:
            x: Training inputs, or a loader of ``(x_b, y_b)`` batches (``y=None``; its first
                ``max_points`` rows are read). # shape: (N, ...)
            y: Training targets. # shape: (N,)
            thetas: Subspace samples. # shape: (S, r)
            max_points: Rows used (the first ones).

        Returns:
            ``True`` when the fit explains enough (always for classification).

        Warns:
            VarianceCollapseWarning: When :math:`R^2 < 0.1`.
        """
        if not self.likelihood.is_regression:
            return True
        x, y = self._data_pair(x, y, what="SubspaceModel.check_fit")
        if isinstance(x, _Stream):
            x, y = _first_rows(x, max_points)
        sub = slice(0, min(x.shape[0], max_points))
        with torch.no_grad():
            means = self.predict(x[sub], thetas)["means"].mean(0)
        return check_explained_variance(
            means.reshape(-1),
            y[sub].reshape(-1).to(means),
            name=f"SubspaceModel (T = {self.temperature:.3g}, {thetas.shape[0]} samples)",
            stacklevel=3,
            advice="Train the network's trajectory longer, lower the temperature, or check "
            "that the inputs carry signal.",
        )

    def select_temperature(
        self,
        x: torch.Tensor | Iterable,
        y: torch.Tensor | None,
        x_val: torch.Tensor | Iterable,
        y_val: torch.Tensor | None,
        temperatures: Sequence[float] | None = None,
        *,
        num_samples: int = 32,
        burn_in: int = 32,
        calibrate_variance: bool | None = None,
        method: str = "ess",
        vi_steps: int = 1000,
        generator: torch.Generator | None = None,
    ) -> TemperatureSelection:
        r"""Choose the likelihood temperature :math:`T` on held-out rows, by ESS or VI.

        For every candidate :math:`T` (default the grid :math:`(N / r)^e`,
        :math:`e \in \{-1, -0.5, \dots, 2\}`, around drbayes's :math:`N / r`; the range the
        validation search of ``benchmarks/subspace_uci.py`` found in use) draws ``num_samples``
        samples from the tempered posterior given ``(x, y)``, by elliptical slice sampling
        (``method="ess"``) or from the mean-field ``q`` that :meth:`fit_vi` fits at that
        :math:`T` (``method="vi"``, ``vi_steps`` steps; the winner's ``q`` is kept), and scores
        the mean held-out log predictive density,

        .. math::

            \frac{1}{M} \sum_{i=1}^{M} \log \frac{1}{S} \sum_{s=1}^{S}
            p(y^{\text{val}}_i \mid x^{\text{val}}_i, \theta_s)

        (a Gaussian mixture for regression, the sample average of class probabilities for
        classification).  The best :math:`T` is stored in ``self.temperature`` and its
        samples returned, after :meth:`check_fit` on the training rows.  The rows of ``(x_val, y_val)`` must not have been used to train the
        network whose trajectory spans the subspace.

        Either pair may be a loader of ``(x_b, y_b)`` batches in place of the tensors (``y`` or
        ``y_val`` then ``None``): the training likelihood is streamed (:meth:`sample_ess`,
        :meth:`fit_vi`), :math:`N` is counted in one pass, and the held-out predictions are
        gathered batch by batch.

        Args:
            x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
            y: Training targets (``None`` with a loader). # shape: (N,)
            x_val: Held-out inputs, or a loader of batches. # shape: (M, ...)
            y_val: Held-out targets (``None`` with a loader). # shape: (M,)
            temperatures: Candidate temperatures (positive).
            num_samples: ESS samples per candidate.
            burn_in: ESS transitions discarded per candidate.
            calibrate_variance: For regression, score every candidate at its own held-out
                variance scale :math:`\kappa_T` (:meth:`calibrate_variance`) and keep the
                winner's in ``self.variance_scale``.  ``None`` (default): for regression
                likelihoods.  The temperature only widens the posterior over weights; a
                network that fits its training rows also learns too small a noise (a
                heteroscedastic head most of all), which no temperature corrects: on the
                boston splits 0-5 (``HeteroscedasticMLP(13, [50])``, PCA rank 10) the test
                coverage of the central 95% interval was 0.84-0.90 without it and 0.86-1.00
                (mean 0.95) with it, :math:`\kappa` 1.6-5.2; on yacht 0.87-0.97 (mean 0.92)
                with :math:`\kappa` 0.14-0.74.
            method: ``"ess"`` or ``"vi"``.
            vi_steps: ``num_steps`` of :meth:`fit_vi` per candidate (``method="vi"``).
            generator: Random generator.

        Returns:
            A :class:`~gpext.fit.TemperatureSelection` (unpacks as ``(temperature, thetas,
            scores)``): the chosen :math:`T`, its samples ``(S, r)`` and the held-out score of
            every candidate (at its :math:`\kappa_T` when calibrating).

        Raises:
            InputDataError: For non-positive temperatures, non-finite data or an unknown
                ``method``.
            ShapeError: If inputs and targets disagree.
        """
        x, y = self._data_pair(x, y, what="SubspaceModel.select_temperature")
        x_val, y_val = self._data_pair(
            x_val, y_val, "x_val", "y_val", what="SubspaceModel.select_temperature"
        )
        if method not in ("ess", "vi"):
            raise InputDataError(
                expected_got("SubspaceModel.select_temperature.method", "'ess' or 'vi'", method)
            )
        if temperatures is None:
            ratio = _num_rows(x) / self.rank
            temperatures = [ratio**e for e in (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)]
        temps = [float(t) for t in temperatures]
        if not temps or not all(math.isfinite(t) and t > 0 for t in temps):
            raise InputDataError(
                expected_got("SubspaceModel.select_temperature.temperatures",
                             "one or more positive finite numbers", temperatures)
            )  # fmt: skip
        if calibrate_variance is None:
            calibrate_variance = self.likelihood.is_regression
        scores: dict[float, float] = {}
        best: tuple[float, float, torch.Tensor, float] | None = None
        original = (self.temperature, self.variance_scale)
        best_q = None
        for t in temps:
            self.temperature = t
            if method == "ess":
                thetas = self.sample_ess(x, y, num_samples, burn_in=burn_in, generator=generator)
            else:
                self.fit_vi(x, y, num_steps=vi_steps, generator=generator, show_progress=False)
                thetas = self.sample_vi(num_samples, generator=generator)
            kappa = self.variance_scale
            with torch.no_grad():
                if calibrate_variance and self.likelihood.is_regression:
                    kappa, score = self._best_variance_scale(x_val, y_val, thetas)
                else:
                    out, y_val_all = self._predict_data(x_val, y_val, thetas)
                    if "probs" in out:
                        p = out["probs"].mean(0).gather(-1, y_val_all.long().view(-1, 1))
                        score = float(p.clamp_min(1e-300).log().mean())
                    else:
                        score = mixture_gaussian_log_likelihood(
                            out["means"], out["variances"], y_val_all
                        )
            scores[t] = score if math.isfinite(score) else -math.inf
            if best is None or scores[t] > best[1]:
                best = (t, scores[t], thetas, kappa)
                best_q = self.variational
        if best is None or not math.isfinite(best[1]):
            self.temperature, self.variance_scale = original
            raise InputDataError(
                "SubspaceModel.select_temperature: every candidate temperature gave a "
                f"non-finite held-out log-likelihood ({scores}); check the held-out data and "
                "the likelihood."
            )
        self.temperature, self.variance_scale = best[0], best[3]
        if method == "vi":
            self.variational = best_q
        self.check_fit(x, y, best[2])
        if self.likelihood.is_regression:
            train_mean = y.double().mean() if torch.is_tensor(y) else None
            tensors = all(torch.is_tensor(v) for v in (x, y, x_val, y_val))
            reference = (reference_heldout_nll(x, y, x_val, y_val,
                                               generator=torch.Generator().manual_seed(0))
                         if tensors else None)  # fmt: skip
            self.check_heldout(x_val, y_val, best[2], train_mean=train_mean,
                               cross_fit_variance=calibrate_variance,
                               reference_nll=reference)  # fmt: skip
        return TemperatureSelection(best[0], best[2], scores)

    @torch.no_grad()
    def check_heldout(
        self,
        x_val: torch.Tensor | Iterable,
        y_val: torch.Tensor | None,
        thetas: torch.Tensor,
        *,
        train_mean: float | torch.Tensor | None = None,
        cross_fit_variance: bool = False,
        reference_nll: float | None = None,
    ) -> HeldoutCheck:
        r"""The shared held-out check (:func:`gpext.fit.check_heldout`) of the model average.

        The equal mixture over ``thetas`` is moment-matched, mean
        :math:`\bar\mu = \frac1S\sum_s\mu_s` and variance
        :math:`\frac1S\sum_s \kappa\sigma^2_s + \frac1S\sum_s(\mu_s - \bar\mu)^2`, and
        scored on the held-out rows: :math:`R^2 \le 0` warns with
        :class:`~gpext.errors.NoSignalWarning`, a coverage of the central 95% interval far
        below 0.95 with :class:`~gpext.errors.OverconfidenceWarning`, variances several times
        too large with :class:`~gpext.errors.UnderconfidenceWarning`.  Run at the end of
        :meth:`select_temperature` on its held-out rows.  With ``cross_fit_variance`` the
        variance factor :math:`\kappa` was chosen on these same rows, so it is cross-fitted
        for the check: chosen on the even rows for the odd ones and on the odd rows for the
        even ones (otherwise the check would grade the calibration on its own data).

        Args:
            x_val: Held-out inputs (or a loader of ``(x_b, y_b)`` batches). # shape: (M, ...)
            y_val: Held-out targets. # shape: (M,)
            thetas: Subspace samples. # shape: (S, r)
            train_mean: The training targets' mean (default the held-out targets' mean).
            cross_fit_variance: Cross-fit :math:`\kappa` as above (else ``variance_scale``).
            reference_nll: Held-out NLL of a plain exact GP fitted to the training rows
                (:func:`gpext.fit.reference_heldout_nll`; :meth:`select_temperature` passes
                it for tensor data): a :class:`~gpext.errors.ReferenceGapWarning` when the
                model average is more than 0.5 nats per point worse.

        Returns:
            The :class:`~gpext.fit.HeldoutCheck`.
        """
        saved, self.variance_scale = self.variance_scale, 1.0
        try:
            out, y_all = self._predict_data(x_val, y_val, thetas)
        finally:
            self.variance_scale = saved
        return check_mixture_heldout(
            out["means"], out["variances"], y_all, variance_scale=float(saved),
            cross_fit_variance=cross_fit_variance, train_mean=train_mean,
            reference_nll=reference_nll,
            name=f"SubspaceModel (T = {self.temperature:.3g}, {thetas.shape[0]} samples)",
        )  # fmt: skip

    @torch.no_grad()
    def _best_variance_scale(
        self, x_val: torch.Tensor, y_val: torch.Tensor, thetas: torch.Tensor
    ) -> tuple[float, float]:
        """``(kappa, mean held-out log density at kappa)`` for the network's own variances."""
        saved, self.variance_scale = self.variance_scale, 1.0
        try:
            out, y_val = self._predict_data(x_val, y_val, thetas)
        finally:
            self.variance_scale = saved
        return select_mixture_variance_scale(out["means"], out["variances"], y_val)

    def calibrate_variance(
        self, x_val: torch.Tensor | Iterable, y_val: torch.Tensor | None, thetas: torch.Tensor
    ) -> float:
        r"""Scale the predicted observation variances to maximise the held-out likelihood.

        With the samples' means :math:`\mu_s(x)` and variances :math:`\sigma^2_s(x)`,

        .. math::

            \hat\kappa = \arg\max_{\kappa > 0} \frac1M \sum_{i=1}^M \log \frac1S
            \sum_{s=1}^S \mathcal N\big(y_i \mid \mu_s(x_i), \kappa\, \sigma^2_s(x_i)\big),

        found on a grid of :math:`\log\kappa \in [-7, 7]` refined by golden-section search
        (:func:`gpext.fit.minimize_scalar_on_grid`), and stored in ``self.variance_scale``;
        :meth:`predict` multiplies its ``"variances"`` by it.  Only the predictive is changed,
        not the likelihood that the samplers and VI use.  The rows must not have been used to
        train the network.

        Args:
            x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches (``y_val=None``; the
                predictions, of shape ``(S, M)``, are gathered batch by batch). # shape: (M, ...)
            y_val: Held-out targets. # shape: (M,)
            thetas: Subspace samples. # shape: (S, r)

        Returns:
            :math:`\hat\kappa`.

        Raises:
            InputDataError: For a classification likelihood or non-finite data.
            ShapeError: If inputs and targets disagree.
        """
        if not self.likelihood.is_regression:
            raise InputDataError(
                expected_got("SubspaceModel.calibrate_variance", "a regression likelihood",
                             self.likelihood.kind)
            )  # fmt: skip
        x_val, y_val = self._data_pair(
            x_val, y_val, "x_val", "y_val", what="SubspaceModel.calibrate_variance"
        )
        self.variance_scale = self._best_variance_scale(x_val, y_val, thetas)[0]
        return self.variance_scale

    def fit_vi(
        self,
        x: torch.Tensor | Iterable,
        y: torch.Tensor | None = None,
        *,
        num_steps: int = 1000,
        lr: float = 5e-2,
        num_mc: int = 4,
        batch_size: int | None = None,
        minibatch: bool = False,
        init_std: float | None = None,
        map_init: bool = True,
        map_max_iter: int = 100,
        final_lr_ratio: float = 0.01,
        check_samples: int = 128,
        check_tol: float = 0.2,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> FitResult:
        r"""Fit the mean-field Gaussian :math:`q(\theta)` by maximising the tempered ELBO.

        Three stages:

        1. **Initialisation.** With ``map_init`` the mean starts at the MAP of the tempered
           log joint :math:`\ell(\theta) = \frac1T \sum_n \log p(y_n \mid f_{w(\theta)}(x_n))
           - \|\theta\|^2 / (2\sigma_p^2)`, found by full-batch L-BFGS
           (:func:`gpext.fit.minimize_lbfgs`); otherwise at 0, the subspace centre.  The
           reference scales are :math:`c_j = (\max(-\partial_j^2 \ell, \sigma_p^{-2}))^{-1/2}`
           (the diagonal of the Hessian there): for a Gaussian posterior the MAP and
           :math:`c` *are* the optimal mean-field ``q`` (its mean is the posterior mean, its
           variances the inverse diagonal of the posterior precision).
        2. **ELBO ascent** with Adam (:func:`gpext.fit.train_loop`, cosine schedule from ``lr``
           to ``lr * final_lr_ratio``) in coordinates whitened by :math:`c`,
           :math:`\mu = \mu_0 + c \odot u` and :math:`\log s = \log c + v`, so ``lr`` is a
           step in posterior standard deviations (resp. in log-scale) whatever the scale of the
           posterior.  Each step uses ``num_mc`` reparameterised samples in antithetic pairs
           :math:`\mu \pm s \odot \epsilon` (for a quadratic log joint the mean gradient of a
           pair is exact).
        3. **Convergence check** with ``check_samples`` antithetic samples (on the full data;
           with ``batch_size`` one random minibatch per pair):
           the ELBO gradient in natural units, :math:`s_j\, \partial_{\mu_j}(-\mathcal L)`
           (about the distance of :math:`\mu_j` from its optimum in standard deviations) and
           :math:`\partial_{\log s_j}(-\mathcal L)` (about :math:`s_j^2/s_j^{*2} - 1`; its
           :math:`\epsilon_j^2` term is removed by a control variate).  When both halves of
           the samples put one of them beyond ``check_tol`` by two standard errors, on the same
           side, a :class:`~gpext.errors.ConvergenceWarning` is issued (halves rather than one
           standard-error bound: network gradients are heavy-tailed).

        Data loaders: ``x`` may be a loader of ``(x_b, y_b)`` batches (``y=None``).  By default
        (``minibatch=False``) every likelihood evaluation is a full pass over the loader, the
        exact sum over its batches in memory of one batch (:meth:`log_likelihood`), as the
        tensor path's full batch.  With ``minibatch=True`` each Adam step (and each pair of the
        check) uses the next batch :math:`\mathcal B_b` of the loader, one epoch per pass, with
        the stochastic estimate

        .. math::

            \widehat{\ell}_b(\theta) = \frac{N}{|\mathcal B_b|} \sum_{n \in \mathcal B_b}
            \log p(y_n \mid f_{w(\theta)}(x_n)),

        unbiased for :math:`\sum_n \log p(y_n \mid f_{w(\theta)}(x_n))` when the batch is a
        uniformly random subset of its size (a loader with ``shuffle=True``: each row lies in
        batch :math:`b` with probability :math:`|\mathcal B_b| / N`), whatever the batch sizes;
        :math:`N` is counted in a first pass.  A loader that does not shuffle gives a biased
        estimate per step (unbiased only averaged over an epoch of equal-sized batches).  The
        MAP start and the curvature always use full passes.  ``batch_size`` applies to tensors
        only.

        Args:
            x: Training inputs (any trailing shape, e.g. images), or a loader of
                ``(x_b, y_b)`` batches. # shape: (N, ...)
            y: Training targets (``None`` with a loader). # shape: (N,)
            num_steps: Adam steps (with ``batch_size`` or ``minibatch``: rounded up to whole
                epochs).
            lr: Adam learning rate in whitened units (see above).
            num_mc: Monte Carlo samples per step (antithetic pairs when even).
            batch_size: Mini-batch size (``None``: full batch); the likelihood is rescaled by
                ``N / batch_size``.  The MAP and the curvature evaluate the full data in chunks
                of this size.
            minibatch: With a loader, use one batch per step with the :math:`N / |\mathcal B_b|`
                scaled estimate above (``False``: a full pass per step).
            init_std: Initial standard deviation of ``q`` (``None``: the reference scales
                :math:`c`, the recommended choice).
            map_init: Start the mean at the MAP (``False``: at 0).
            map_max_iter: L-BFGS iterations of the MAP stage.
            final_lr_ratio: Final learning rate relative to ``lr`` (1 keeps it constant).
            check_samples: Samples of the final convergence check (0 switches it off).
            check_tol: Tolerance of the check in the natural units above.
            generator: Random generator for the samples and the mini-batches.
            show_progress: Progress bar.

        Returns:
            A :class:`~gpext.fit.FitResult`: ``losses`` is the negative ELBO estimate per step
            (per epoch with ``batch_size``), ``history["map_losses"]`` the L-BFGS trace of the
            MAP stage (with ``map_init``), ``grad_norm`` the norm of the ELBO gradient with respect to
            ``(q.loc, q.rho)`` estimated by the check (``nan`` without it), ``stop_reason``
            ``CONVERGED`` when the check passed.  The fitted :class:`MeanFieldGaussian` is :attr:`variational`.

        Raises:
            InputDataError: If ``x`` or ``y`` has NaN or infinite entries, or for invalid
                settings.
            FitError: If the loss becomes non-finite; :attr:`variational` then holds the last
                finite state (at most 10 steps old).

        Warns:
            ConvergenceWarning: When the check finds the ELBO gradient clearly above
                ``check_tol`` (raise ``num_steps`` or ``num_mc``).
        """
        start = time.perf_counter()
        what = "SubspaceModel.fit_vi"
        x, y = self._data_pair(x, y, what=what)
        stream = isinstance(x, _Stream)
        if stream and batch_size is not None:
            raise InputDataError(
                expected_got(f"{what}.batch_size", "None when x is a loader", batch_size,
                             "Set the batch size in the loader (and minibatch=True for "
                             "one batch per step).")
            )  # fmt: skip
        if minibatch and not stream:
            raise InputDataError(
                expected_got(f"{what}.minibatch", "False for tensor data", minibatch,
                             "Pass batch_size for minibatches of tensors, or a loader.")
            )  # fmt: skip
        self.refresh_batch_norm(x)
        num_steps = check_positive_int(num_steps, f"{what}.num_steps")
        num_mc = check_positive_int(num_mc, f"{what}.num_mc")
        map_max_iter = check_positive_int(map_max_iter, f"{what}.map_max_iter")
        if not (lr > 0 and 0 <= final_lr_ratio <= 1 and check_tol > 0):
            raise InputDataError(
                expected_got(
                    what,
                    "lr > 0, 0 <= final_lr_ratio <= 1 and check_tol > 0",
                    (lr, final_lr_ratio, check_tol),
                )
            )
        if not (isinstance(check_samples, int) and check_samples >= 0):
            raise InputDataError(
                expected_got(f"{what}.check_samples", "an integer >= 0", check_samples)
            )
        if init_std is not None and not init_std > 1e-6:
            raise InputDataError(
                expected_got(f"{what}.init_std", "None or a number > 1e-6", init_std)
            )
        n = _num_rows(x)
        if stream:
            bs = None  # the loader's batches
        else:
            bs = (
                n
                if batch_size is None
                else min(check_positive_int(batch_size, f"{what}.batch_size"), n)
            )
        dtype, device = self.center.dtype, self.center.device

        # 1. initial mean (MAP) and reference scales (curvature)
        theta = nn.Parameter(torch.zeros(self.rank, dtype=dtype, device=device))
        map_result = None
        if map_init:
            map_result = self._fit_map(theta, x, y, bs, map_max_iter, show_progress)
        loc0 = theta.detach().clone()
        ref = self._reference_scales(loc0, x, y, bs)
        scale0 = ref if init_std is None else torch.full_like(ref, float(init_std))
        q = MeanFieldGaussian(self.rank, dtype=dtype).to(device)
        q.set_moments(loc0, scale0)
        white = _WhitenedGaussian(loc0, ref, scale0)

        # 2. ELBO ascent
        def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
            eps = torch.randn((count + 1) // 2, self.rank, generator=generator, dtype=dtype)
            eps = torch.cat([eps, -eps])[:count].to(device)
            return white.loc + white.scale * eps, eps

        vectorise = [num_mc > 1]  # torch.func.vmap over the samples, until it fails once

        def neg_elbo(batch: torch.Tensor | None = None) -> torch.Tensor:
            if stream:
                thetas, _ = sample(num_mc)
                if minibatch:  # the next batch of the loader, scaled by N / B_b
                    xb, yb = _next_batch(live, x)
                    part = _Stream.of(self, xb, yb)
                    ll = self._stream_log_likelihoods(thetas, part).mean() * (n / xb.shape[0])
                else:
                    ll = self._stream_log_likelihoods(thetas, x).mean()
                return -ll / self.temperature + _kl_to_prior(white.loc, white.scale, self.prior_std)
            xb, yb = (x, y) if batch is None else (x[batch], y[batch])
            thetas, _ = sample(num_mc)
            ll = None
            if vectorise[0]:
                try:
                    ll = torch.func.vmap(lambda t: self.log_likelihood(t, xb, yb))(thetas).mean()
                except (RuntimeError, NotImplementedError, ValueError, TypeError):
                    vectorise[0] = False  # e.g. a module with data-dependent control flow
            if ll is None:
                ll = torch.stack([self.log_likelihood(t, xb, yb) for t in thetas]).mean()
            ll = ll * (n / xb.shape[0])
            return -ll / self.temperature + _kl_to_prior(white.loc, white.scale, self.prior_std)

        batches = None
        epochs = num_steps
        live: list[Iterator] = [iter(())]
        if stream and minibatch:
            per_epoch = x.num_batches
            epochs = max(1, math.ceil(num_steps / per_epoch))

            def batches(epoch: int) -> range:
                # one pass of the loader per epoch, read lazily by neg_elbo (memory of a batch)
                live[0] = iter(x)
                return range(per_epoch)

        elif not stream and bs < n:
            per_epoch = len(minibatch_indices(n, bs, min_size=max(1, bs // 2)))
            epochs = max(1, math.ceil(num_steps / per_epoch))

            def batches(epoch: int) -> list[torch.Tensor]:
                return minibatch_indices(
                    n, bs, generator=generator, device=x.device, min_size=max(1, bs // 2)
                )

        opt = torch.optim.Adam(white.parameters(), lr=lr, betas=(0.9, 0.99))
        try:
            result = train_loop(
                neg_elbo,
                opt,
                modules=[white],
                epochs=epochs,
                batches=batches,
                lr_schedule="cosine",
                final_lr_ratio=final_lr_ratio,
                snapshot_every=10,
                show_progress=show_progress,
                desc=what,
            )
        except FitError:
            q.set_moments(white.loc.detach(), white.scale.detach())
            self.variational = q
            raise
        q.set_moments(white.loc.detach(), white.scale.detach())
        self.variational = q
        if map_result is not None:
            result.history["map_losses"] = list(map_result.losses)
            result.num_evaluations += map_result.num_evaluations
            result.message = (
                f"MAP start: L-BFGS {map_result.stop_reason.value} after "
                f"{map_result.num_iterations} iterations; ELBO ascent: {result.message}"
            )

        # 3. convergence check (train_loop's grad_norm is one noisy step's, in whitened units)
        result.grad_norm = math.nan
        if check_samples > 0:
            chunk = bs if not stream else (-1 if minibatch else None)
            self._check_vi(q, x, y, chunk, check_samples, check_tol, generator, result)
        result.seconds = time.perf_counter() - start
        return result

    def _neg_log_joint(
        self,
        theta: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        chunk: int,
        *,
        prior: bool = True,
    ) -> torch.Tensor:
        r""":math:`-\ell(\theta)` on the full data, in chunks; value and gradient are exact.

        With several chunks each chunk's graph is freed after its gradient; the returned
        tensor carries the summed gradient through a linear surrogate.  ``prior=False``
        leaves out the prior term.
        """
        log_prior = theta.pow(2).sum() / (2 * self.prior_std**2) if prior else 0.0
        if not isinstance(x, _Stream) and chunk >= x.shape[0]:
            return log_prior - self.log_likelihood(theta, x, y) / self.temperature
        value = torch.zeros((), dtype=theta.dtype, device=theta.device)
        grad = torch.zeros_like(theta)
        for xb, yb in _chunks(x, y, chunk):
            ll = self.log_likelihood(theta, xb, yb)
            (g,) = torch.autograd.grad(ll, theta)
            value = value + ll.detach()
            grad = grad + g
        value, grad = -value / self.temperature, -grad / self.temperature
        return log_prior + value + (theta * grad).sum() - (theta * grad).sum().detach()

    def _fit_map(
        self,
        theta: nn.Parameter,
        x: torch.Tensor,
        y: torch.Tensor,
        chunk: int,
        max_iter: int,
        show_progress: bool | None,
    ) -> FitResult:
        """MAP of the tempered log joint by L-BFGS (in place on ``theta``)."""
        with warnings.catch_warnings():
            # the ELBO stage and its check judge convergence; a loose MAP is only a start
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", OptimizerStallWarning)
            try:
                return minimize_lbfgs(
                    lambda: self._neg_log_joint(theta, x, y, chunk),
                    [theta],
                    max_iter=max_iter,
                    warn_on_stall=False,
                    show_progress=show_progress,
                    desc="SubspaceModel.fit_vi (MAP)",
                )
            except FitError as err:
                raise FitError(
                    "SubspaceModel.fit_vi: the tempered log joint is not finite at the subspace "
                    f"centre ({err}). Check the network, the centre and the data.",
                    err.result,
                ) from err

    def _reference_scales(
        self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, chunk: int | None
    ) -> torch.Tensor:
        r""":math:`(\max(H_{jj}, \sigma_p^{-2}))^{-1/2}`, :math:`H` the Hessian of :math:`-\ell`."""
        floor = 1.0 / self.prior_std**2
        diag = torch.zeros_like(theta)
        try:
            for xb, yb in _chunks(x, y, chunk):
                t = theta.detach().clone().requires_grad_(True)
                ll = self.log_likelihood(t, xb, yb)
                (g,) = torch.autograd.grad(ll, t, create_graph=True)
                for j in range(self.rank):
                    (h,) = torch.autograd.grad(g[j], t, retain_graph=j < self.rank - 1)
                    diag[j] -= h[j].detach()
        except RuntimeError:  # no double backward through this network: use the prior scale
            diag.zero_()
        diag = torch.nan_to_num(diag / self.temperature, nan=0.0, posinf=0.0)
        return (diag.clamp_min(0.0) + floor).rsqrt()

    @torch.no_grad()
    def _check_vi(
        self,
        q: MeanFieldGaussian,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        num_samples: int,
        tol: float,
        generator: torch.Generator | None,
        result: FitResult,
    ) -> None:
        """The convergence check of :meth:`fit_vi` (fills ``result``; may warn)."""
        mu, s = q.loc.detach(), q.scale.detach()
        prior_var = self.prior_std**2
        pairs = max(8, (num_samples + 1) // 2)
        eps = torch.randn(pairs, self.rank, generator=generator, dtype=mu.dtype).to(mu.device)
        g_lik, values = [], []  # gradients and values of -sum log p / T at mu +- s eps
        n = _num_rows(x)
        live: list[Iterator] = [iter(())]
        for e in eps:
            # with minibatches each pair sees one random minibatch (the cost of a training
            # step; the subsampling noise enters the standard errors)
            if isinstance(x, _Stream):
                if batch_size is None:  # a full pass per evaluation
                    xb, yb, factor = x, None, 1.0
                else:  # the next batch of the loader
                    xb, yb = _next_batch(live, x)
                    factor = n / xb.shape[0]
            elif batch_size < n:
                idx = torch.randperm(n, generator=generator)[:batch_size].to(x.device)
                xb, yb, factor = x[idx], y[idx], n / batch_size
            else:
                xb, yb, factor = x, y, 1.0
            for sign in (1.0, -1.0):
                t = (mu + sign * s * e).requires_grad_(True)
                with torch.enable_grad():
                    value = factor * self._neg_log_joint(t, xb, yb, n, prior=False)
                    (g,) = torch.autograd.grad(value, t)
                g_lik.append(g)
                values.append(float(value.detach()))
        g_plus, g_minus = torch.stack(g_lik[0::2]), torch.stack(g_lik[1::2])  # (pairs, r)
        # per pair: gradients of -ELBO w.r.t. mu and log s (antithetic averages)
        g_mu = 0.5 * (g_plus + g_minus) + mu / prior_var
        g_ls = 0.5 * s * eps * (g_plus - g_minus) - 1.0 + s**2 / prior_var
        # control variate: the eps_j^2 term of g_ls (exact for a quadratic log joint's
        # diagonal) has known mean; its coefficient is regressed on the same samples
        feat = eps**2 - 1.0
        fc = feat - feat.mean(0)
        coef = (fc * (g_ls - g_ls.mean(0))).sum(0) / fc.pow(2).sum(0).clamp_min(1e-12)
        g_ls = g_ls - coef * feat
        z_mu, z_ls = g_mu.mean(0) * s, g_ls.mean(0)
        g_rho = z_ls * torch.sigmoid(q.rho.detach()) / s
        result.grad_norm = float(torch.cat([g_mu.mean(0), g_rho]).norm())
        neg_elbo = sum(values) / len(values) + float(q.kl_divergence(self.prior_std))
        # a coordinate is off when both halves of the samples put it beyond the tolerance
        # (by two standard errors) on the same side: robust to the heavy tails of network
        # gradients, which make a single standard-error bound unreliable
        z = torch.cat([g_mu * s, g_ls], dim=1)  # (pairs, 2r)
        halves = [z[: pairs // 2], z[pairs // 2 :]]
        means = [h.mean(0) for h in halves]
        lower = [m.abs() - 2 * h.std(0) / math.sqrt(h.shape[0]) for m, h in zip(means, halves)]
        same_side = torch.sign(means[0]) == torch.sign(means[1])
        excess = float(torch.where(same_side, torch.minimum(*lower), -math.inf).max())
        se = z.std(0) / math.sqrt(pairs)
        j_mu, j_ls = int(z_mu.abs().argmax()), int(z_ls.abs().argmax())
        summary = (
            f"ELBO gradient in natural units, largest entries: mean {float(z_mu[j_mu].abs()):.3g}"
            f" +- {float(se[j_mu]):.2g} sd, log-scale {float(z_ls[j_ls].abs()):.3g} +- "
            f"{float(se[self.rank + j_ls]):.2g} ({2 * pairs} samples; off when beyond {tol:g} by 2 "
            "standard errors in both halves); "
            f"negative ELBO {neg_elbo:.6g}"
        )
        if excess <= tol:
            result.stop_reason = StopReason.CONVERGED
            result.message = f"{result.message}; converged: {summary}"
            return
        result.message = f"{result.message}; not converged: {summary}"
        result.add_problem(ConvergenceWarning.__name__)
        warnings.warn(
            f"SubspaceModel.fit_vi: the variational fit has not converged ({summary}). Raise "
            "num_steps or num_mc, or keep init_std=None and map_init=True.",
            ConvergenceWarning,
            stacklevel=3,
        )

    @torch.no_grad()
    def elbo(
        self,
        x: torch.Tensor | Iterable,
        y: torch.Tensor | None = None,
        *,
        num_samples: int = 64,
        minibatch: bool = False,
        generator: torch.Generator | None = None,
    ) -> float:
        r"""Monte Carlo estimate of the tempered ELBO of the fitted ``q`` (:meth:`fit_vi`).

        .. math::

            \widehat{\mathcal L} = \frac{1}{T}\,\frac1S \sum_{s=1}^S \hat\ell(\theta_s)
            - \mathrm{KL}\big(q \,\|\, \mathcal N(0, \sigma_p^2 I)\big), \qquad
            \theta_s \sim q,

        with :math:`\hat\ell` the full-data log-likelihood (:meth:`log_likelihood`; a
        streamed sum for a loader) or, with ``minibatch=True`` and a loader, the estimate
        :math:`\frac{N}{|\mathcal B|}\sum_{n \in \mathcal B} \log p(y_n \mid
        f_{w(\theta)}(x_n))` on the first batch :math:`\mathcal B` of a new pass of the
        loader, the estimator of :meth:`fit_vi` with ``minibatch=True`` (unbiased for a
        shuffling loader).

        Args:
            x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
            y: Training targets (``None`` with a loader). # shape: (N,)
            num_samples: Samples ``S`` of :math:`q`.
            minibatch: One batch of the loader instead of a full pass (loaders only).
            generator: Random generator of the samples.

        Returns:
            The estimate.

        Raises:
            NotFittedError: Before :meth:`fit_vi`.
            InputDataError: For ``minibatch=True`` with tensors, or invalid data.
        """
        if self.variational is None:
            raise NotFittedError("SubspaceModel.elbo: call fit_vi first.")
        what = "SubspaceModel.elbo"
        num_samples = check_positive_int(num_samples, f"{what}.num_samples")
        x, y = self._data_pair(x, y, what=what)
        if minibatch and not isinstance(x, _Stream):
            raise InputDataError(
                expected_got(f"{what}.minibatch", "False for tensor data", minibatch,
                             "Pass a loader for minibatch estimates.")
            )  # fmt: skip
        q = self.variational
        thetas = q.rsample(num_samples, generator=generator)
        if not isinstance(x, _Stream):
            ll = torch.stack([self.log_likelihood(t, x, y) for t in thetas])
        elif minibatch:
            xb, yb = next(iter(x))
            part = _Stream.of(self, xb, yb)
            ll = self._stream_log_likelihoods(thetas, part) * (x.num_rows / xb.shape[0])
        else:
            ll = self._stream_log_likelihoods(thetas, x)
        kl = q.kl_divergence(self.prior_std)
        return float(ll.mean() / self.temperature - kl)

    def sample_vi(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Samples of :math:`\\theta` from the fitted ``q``. # shape: (S, r)"""
        if self.variational is None:
            raise NotFittedError("SubspaceModel.sample_vi: call fit_vi first.")
        with torch.no_grad():
            return self.variational.rsample(num_samples, generator=generator)

    def predict(
        self,
        x: torch.Tensor | Iterable,
        thetas: torch.Tensor,
        *,
        bn_inputs: torch.Tensor | Iterable | None = None,
    ) -> dict[str, torch.Tensor]:
        """Per-sample predictions for Bayesian model averaging.

        ``x`` may be a loader of input batches (tensors, or tuples ``(x_b, ...)`` whose first
        element is taken): it is read once and the predictions are concatenated over its
        batches, in its order (:func:`~gpext.subspace.predict_weight_samples`).

        Args:
            x: Test inputs, or a loader of input batches. # shape: (N, ...)
            thetas: Subspace samples. # shape: (S, r)
            bn_inputs: Training inputs (or a loader of them) for refreshing batch-norm
                statistics per sample (default: the statistics at the centre,
                :attr:`bn_buffers`, once ESS or VI computed them).

        Returns:
            ``{"means", "variances"}`` of shape ``(S, N)`` (the variances times
            ``variance_scale``, see :meth:`calibrate_variance`) or ``{"probs"}`` of shape
            ``(S, N, C)``; see :func:`~gpext.subspace.regression_mixture_moments`.

        Warns:
            BatchNormWarning: For a batch-norm network predicted with neither ``bn_inputs`` nor
                statistics at the centre (no ESS or VI run yet, no :meth:`refresh_batch_norm`).
        """
        thetas = as_model_input(thetas, self.center, "SubspaceModel.predict(thetas)")
        if thetas.dim() != 2 or thetas.shape[-1] != self.rank or thetas.shape[0] == 0:
            raise ShapeError(
                expected_got(
                    "SubspaceModel.predict(thetas)", f"shape (S, {self.rank}), S >= 1",
                    tuple(thetas.shape),
                )
            )  # fmt: skip
        check_finite(thetas, "SubspaceModel.predict(thetas)")
        loader = _is_loader(x)
        if loader:
            x = self._input_loader(x, "SubspaceModel.predict(x)", probe=True)
        else:
            x = self._check_inputs(x, "SubspaceModel.predict(x)")
            self._probe(x, "SubspaceModel.predict(x)")
        if bn_inputs is not None and _is_loader(bn_inputs):
            if thetas.shape[0] > 1:  # read once per sample
                _check_reiterable(bn_inputs, "SubspaceModel.predict(bn_inputs)")
            bn_inputs = self._input_loader(bn_inputs, "SubspaceModel.predict(bn_inputs)")
        elif bn_inputs is not None:
            bn_inputs = self._check_inputs(bn_inputs, "SubspaceModel.predict(bn_inputs)")
        with _eval_mode(self.module):  # every submodule's own mode is restored afterwards
            out = predict_weight_samples(
                self.module,
                self.weights(thetas),
                x,
                self.likelihood,
                bn_inputs=bn_inputs,
                buffers=self.bn_buffers,
                parameters=self.flat.names,
            )
        first = out["means"] if "means" in out else out["probs"]
        rows = x.rows if loader else x.shape[0]
        if first.dim() != (2 if "means" in out else 3) or first.shape[1] != rows:
            raise ShapeError(
                expected_got(
                    "SubspaceModel.predict(x)", f"one prediction per row of x ({rows})",
                    f"predictions of shape {tuple(first.shape[1:])} for x of "
                    f"{rows} rows", "Pass x with one point per row, as in training.",
                )
            )  # fmt: skip
        if "variances" in out and self.variance_scale != 1.0:
            out["variances"] = out["variances"] * self.variance_scale
        return out

    def _check_inputs(self, x: object, name: str) -> torch.Tensor:
        """Network inputs ``(N, ...)``: converted, non-empty, finite, in the model's dtype."""
        if isinstance(x, torch.Tensor) and not (x.is_floating_point() or x.dtype == torch.bool):
            if x.is_complex():
                raise InputDataError(expected_got(name, "real-valued inputs", f"dtype {x.dtype}"))
            x = x.to(self.center.device)  # integer inputs (e.g. indices) go to the network as is
        else:
            x = as_model_input(x, self.center, name)
        if x.dim() == 0 or x.shape[0] == 0:
            raise InputDataError(
                expected_got(name, "at least one row, shape (N, ...)", f"shape {tuple(x.shape)}")
            )
        if x.is_floating_point():
            check_finite(x, name)
        return x

    def _probe(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Evaluate the network at the centre on the first rows of ``x``; gpext errors if it fails."""
        # one cheap forward pass on two rows at the centre: a network that cannot take these
        # inputs, or outputs that do not fit the targets, fail here with a gpext error
        rows = min(2, x.shape[0])
        try:
            with torch.no_grad(), _eval_mode(self.module):
                out = self.flat.functional_call(self.center, x[:rows], buffers=self.bn_buffers)
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            raise _evaluation_error(
                name, "inputs the network can evaluate", x, err,
                "Pass inputs shaped (N, ...) like those the network was trained on.",
            ) from err  # fmt: skip
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != rows:
            raise ShapeError(
                expected_got(
                    name, "one network output per row",
                    f"output of shape {tuple(getattr(out, 'shape', ()))} for {rows} rows of "
                    f"x of shape {tuple(x.shape)}", "Pass one point per row of x.",
                )
            )  # fmt: skip
        return out

    def _check_data(
        self, x: object, y: object, x_name: str = "x", y_name: str = "y"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training (or validation) data: converted and checked, with a probe of the network."""
        x = self._check_inputs(x, f"SubspaceModel({x_name})")
        what = f"SubspaceModel({y_name})"
        if self.likelihood.is_regression:
            y = as_model_input(y, self.center, what)
        else:
            y = check_labels(y, None, what).to(self.center.device)
        if y.dim() == 0 or x.shape[0] != y.shape[0]:
            raise ShapeError(
                expected_got(
                    f"SubspaceModel({x_name}, {y_name})",
                    "equal, non-zero numbers of rows",
                    (tuple(x.shape), tuple(y.shape)),
                )
            )
        if y.is_floating_point():
            check_finite(y, what)
        out = self._probe(x, f"SubspaceModel({x_name})")
        if not self.likelihood.is_regression:
            check_labels(y, out.shape[-1], what)
        elif y.dim() != 1:
            raise ShapeError(expected_got(what, f"shape ({x.shape[0]},)", tuple(y.shape)))
        return x, y

    # ---------------------------------------------------------------- data loaders
    def _data_pair(
        self, x: object, y: object, x_name: str = "x", y_name: str = "y", *, what: str
    ) -> tuple[torch.Tensor, torch.Tensor] | tuple[_Stream, None]:
        """``(x, y)`` checked as tensors (:meth:`_check_data`) or ``(stream, None)`` for a loader."""
        if isinstance(x, _Stream) or _is_loader(x):
            return self._data(x, y, x_name, y_name, what=what), None
        if _is_loader(y):
            raise InputTypeError(
                expected_got(f"{what}({y_name})", f"a tensor of targets, or None when {x_name} "
                             "is a loader of (x, y) batches", f"a loader ({type(y).__name__})",
                             f"Pass the loader as {x_name} and {y_name}=None.")
            )  # fmt: skip
        return self._check_data(x, y, x_name, y_name)

    def _data(self, x: object, y: object, x_name: str, y_name: str, *, what: str) -> _Stream:
        """A checked :class:`_Stream` over a loader of ``(x_b, y_b)`` batches."""
        if isinstance(x, _Stream):
            return x
        if y is not None:
            raise InputDataError(
                expected_got(f"{what}({y_name})", f"None when {x_name} is a loader of (x, y) "
                             "batches", type(y).__name__, "Drop it: the loader yields the targets.")
            )  # fmt: skip
        _check_reiterable(x, f"{what}({x_name})")
        return _Stream(self, x, f"{what}({x_name})")

    def _convert_batch(
        self, xb: torch.Tensor, yb: torch.Tensor, name: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``(x_b, y_b)`` batch in the model's dtype and device, as :meth:`_check_data`."""
        xb = self._check_inputs(xb, f"{name} inputs")
        if self.likelihood.is_regression:
            yb = as_model_input(yb, self.center, f"{name} targets")
            if yb.dim() != 1:
                raise ShapeError(
                    expected_got(f"{name} targets", f"shape ({xb.shape[0]},)", tuple(yb.shape))
                )
        else:
            yb = check_labels(yb, None, f"{name} targets").to(self.center.device)
        return xb, yb

    def _input_loader(self, loader: object, name: str, *, probe: bool = False) -> _MappedLoader:
        """A loader of input batches, converted by :meth:`_check_inputs` (first one probed)."""
        state = {"first": probe}

        def convert(xb: torch.Tensor) -> tuple[torch.Tensor]:
            xb = self._check_inputs(xb, name)
            if state["first"]:
                state["first"] = False
                self._probe(xb, name)
            view.rows += xb.shape[0]
            return (xb,)

        view = _MappedLoader(loader, convert, name, targets=False)
        return view

    def _stream_log_likelihoods(self, thetas: torch.Tensor, stream: _Stream) -> torch.Tensor:
        r""":math:`\sum_b \sum_{n \in b} \log p(y_n \mid \theta_s)` per sample, batch by batch.

        Exact values and first derivatives with respect to ``thetas`` (each batch's graph is
        freed after its gradient; the gradient re-enters through a linear surrogate).

        Args:
            thetas: # shape: (S, r)
            stream: The data.

        Returns:
            # shape: (S,)
        """
        need_grad = torch.is_grad_enabled() and thetas.requires_grad
        leaf = thetas.detach().requires_grad_(need_grad)
        total = torch.zeros(thetas.shape[0], dtype=thetas.dtype, device=thetas.device)
        grad = torch.zeros_like(leaf)
        for xb, yb in stream:
            ll = torch.stack([self.log_likelihood(t, xb, yb) for t in leaf])
            if need_grad:
                (g,) = torch.autograd.grad(ll.sum(), leaf)
                grad = grad + g
            total = total + ll.detach()
        if not need_grad:
            return total
        linear = (thetas * grad).sum(-1)
        return total + linear - linear.detach()

    @torch.no_grad()
    def _predict_data(
        self, x: torch.Tensor | _Stream, y: torch.Tensor | None, thetas: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """:meth:`predict` on (validation) data, with its targets; batch by batch for a stream."""
        if not isinstance(x, _Stream):
            return self.predict(x, thetas), y
        outs, ys = [], []
        for xb, yb in x:
            outs.append(self.predict(xb, thetas))
            ys.append(yb)
        return {k: torch.cat([o[k] for o in outs], dim=1) for k in outs[0]}, torch.cat(ys)

    # ---------------------------------------------------------------- save / restore
    def get_extra_state(self) -> dict:
        """Fitted state outside the parameters: temperature, variance scale, BN statistics,
        the likelihood's noise and target transform (:meth:`OutputLikelihood.state_dict`)."""
        return {
            "temperature": self.temperature,
            "prior_std": self.prior_std,
            "variance_scale": self.variance_scale,
            "bn_buffers": self.bn_buffers,
            "parameters": list(self.flat.names),
            "likelihood": self.likelihood.state_dict(),
        }

    def set_extra_state(self, state: dict) -> None:
        """Restore what :meth:`get_extra_state` saved.

        Raises:
            InputDataError: If the state was saved with another parameter selection.
        """
        names = state.get("parameters")  # absent in states saved before parameter selection
        if names is not None and list(names) != list(self.flat.names):
            raise InputDataError(
                expected_got(
                    "SubspaceModel.load_state_dict", f"a state of the parameters {self.flat.names}",
                    f"a state of the parameters {list(names)}",
                    "Build the model with the same parameters= selection as the saved one.",
                )
            )  # fmt: skip
        self.temperature = float(state["temperature"])
        self.prior_std = float(state["prior_std"])
        self.variance_scale = float(state["variance_scale"])
        self.bn_buffers = state["bn_buffers"]
        if state.get("likelihood") is not None:  # absent in states saved before issue 38
            self.likelihood.load_state_dict(state["likelihood"])

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # a network that standardised its inputs: a freshly built one takes the statistics
        if prefix + "module." + INPUT_LOC in state_dict:
            attach_input_standardization(self.module)
        # the variational q exists only after fit_vi: build (or drop) it before loading
        loc = state_dict.get(prefix + "variational.loc")
        if loc is not None and self.variational is None:
            self.variational = MeanFieldGaussian(loc.shape[0], dtype=loc.dtype).to(loc.device)
        elif loc is None and self.variational is not None and prefix + "center" in state_dict:
            self.variational = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


@contextlib.contextmanager
def _eval_mode(module: nn.Module):
    """Switch ``module`` to eval mode and restore every submodule's own mode afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


class _WhitenedGaussian(nn.Module):
    r""":math:`\mu = \mu_0 + c \odot u`, :math:`s = c \odot e^{v}`: Adam steps in units of ``c``."""

    def __init__(self, loc0: torch.Tensor, ref: torch.Tensor, scale0: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("loc0", loc0.detach().clone())
        self.register_buffer("ref", ref.detach().clone())
        self.u = nn.Parameter(torch.zeros_like(loc0))
        self.v = nn.Parameter((scale0 / ref).log().detach().clone())

    @property
    def loc(self) -> torch.Tensor:
        return self.loc0 + self.ref * self.u

    @property
    def scale(self) -> torch.Tensor:
        return self.ref * self.v.exp()


def _kl_to_prior(loc: torch.Tensor, scale: torch.Tensor, prior_std: float) -> torch.Tensor:
    """Closed-form KL of N(loc, diag(scale)^2) to N(0, prior_std^2 I) (as MeanFieldGaussian)."""
    return (
        math.log(prior_std) - scale.log() + (scale**2 + loc**2) / (2 * prior_std**2) - 0.5
    ).sum()
