r"""Base class of the BoTorch adapters of gpext's sample-based models (ensembles of functions)."""

from __future__ import annotations

import copy
import math
import numbers
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from botorch.acquisition.objective import PosteriorTransform, ScalarizedPosteriorTransform
from botorch.models.ensemble import EnsembleModel
from botorch.models.model import Model
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.base import MCSampler
from botorch.sampling.normal import NormalMCSampler
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.operators import DenseLinearOperator

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query, model_device, model_dtype
from gpext.integrations.botorch._fantasize import noise_floor, run_fantasize
from gpext.integrations.botorch._training_data import TrainingDataMixin
from gpext.integrations.botorch.noisy_ensemble_posterior import NoisyEnsemblePosterior
from gpext.integrations.botorch.noisy_ensemble_sampler import NoisyEnsembleSampler

if TYPE_CHECKING:
    from gpext.integrations.botorch.function_draw_path import FunctionDrawPath

__all__ = ["SampleEnsembleSurrogate"]

_ModelT = TypeVar("_ModelT", bound=Model)


def _check_output_indices(idcs: object, num_outputs: int, what: str) -> list[int]:
    """Validate a non-empty list of output indices in ``[0, num_outputs)``.

    Args:
        idcs: The indices.
        num_outputs: Number of outputs ``m`` of the model.
        what: Name used in messages, e.g. ``"VBootSurrogate.subset_output(idcs)"``.

    Returns:
        The indices as a list of ``int``.

    Raises:
        InputTypeError: If ``idcs`` is not a sequence of integers.
        InputDataError: If it is empty or an index is out of range.
    """
    if isinstance(idcs, torch.Tensor):
        idcs = idcs.tolist()
    if not isinstance(idcs, (list, tuple)) or any(
        isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in idcs
    ):
        raise InputTypeError(expected_got(what, "a list of int", repr(idcs)))
    idx = [int(i) for i in idcs]
    if not idx or any(not 0 <= i < num_outputs for i in idx):
        raise InputDataError(
            expected_got(what, f"a non-empty list of indices in [0, {num_outputs})", idx)
        )
    return idx


def _deepcopy_detached(module: torch.nn.Module) -> torch.nn.Module:
    """``copy.deepcopy(module)`` that copies graph-carrying cached tensors detached.

    ``deepcopy`` refuses non-leaf tensors, which some submodules keep as attributes (e.g. a
    training-batch loss cached for ``kl_divergence``).
    """
    memo: dict[int, object] = {}
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                memo[id(value)] = value.detach().clone()
    return copy.deepcopy(module, memo)


def _subset_output_copy(model: _ModelT, idcs: object) -> _ModelT:
    r"""A deep copy of a gpext adapter restricted to the outputs ``idcs`` (``Model.subset_output``).

    The copy keeps the wrapped model whole and records which of its outputs it exposes in
    ``_output_subset`` (composed with the model's own subset, if any); its outcome transform is
    ``outcome_transform.subset_output(idcs)`` and ``num_outputs`` is ``len(idcs)``.  ``train_Y``
    keeps all columns: refitting the copy refits every output of the wrapped model, of which the
    copy still exposes ``idcs``.

    Args:
        model: A :class:`SampleEnsembleSurrogate` or ``LatentGPSurrogate``.
        idcs: Output indices, relative to ``model.num_outputs``.

    Returns:
        The restricted copy (a new object even when ``idcs`` selects every output).

    Raises:
        InputTypeError: If ``idcs`` is not a list of integers.
        InputDataError: If ``idcs`` is empty or out of range.
        NotImplementedError: (BoTorch's) if the outcome transform cannot be subset.
    """
    m = model.num_outputs
    idx = _check_output_indices(idcs, m, f"{type(model).__name__}.subset_output(idcs)")
    identity = idx == list(range(m))
    octf = getattr(model, "outcome_transform", None)
    new_octf = None if octf is None or identity else octf.subset_output(idcs=idx)
    new = _deepcopy_detached(model)
    if identity:
        return new
    base = model._output_subset if model._output_subset is not None else list(range(m))
    new._output_subset = [base[i] for i in idx]
    new._num_outputs = len(idx)
    if new_octf is not None:
        new.outcome_transform = new_octf
    return new


class SampleEnsembleSurrogate(TrainingDataMixin, EnsembleModel, ABC):
    r"""A BoTorch ``EnsembleModel`` over ``S`` sampled functions :math:`f^{(1)}, \dots, f^{(S)}`.

    The posterior at ``X`` (``batch_shape x q x d``) is the
    :class:`~botorch.posteriors.ensemble.EnsemblePosterior` of the member values
    ``batch_shape x S x q x m``: its mean is the member average, its variance the (unbiased)
    spread of the members,

    .. math::

        \bar f(x) = \frac1S \sum_{s=1}^S f^{(s)}(x), \qquad
        \operatorname{Var}[f(x)] = \frac{1}{S - 1}\sum_{s=1}^S \big(f^{(s)}(x) - \bar f(x)\big)^2,

    and its samples are whole members (BoTorch's ``IndexSampler`` draws member indices), so a
    posterior sample is a function: Monte Carlo acquisition functions see joint samples over the
    ``q`` points and Thompson sampling maximises one member (:meth:`draw_functions` gives
    member functions for continuous Thompson sampling, as BoTorch's ``PathwiseThompsonSampling``
    uses them).  The members are fixed once the model is built, so acquisition values are
    deterministic.

    A posterior transform ``g`` (e.g. BoTorch's ``ScalarizedPosteriorTransform``) is applied to
    every member, :math:`g(f^{(1)}), \dots, g(f^{(S)})`: the posterior of :math:`g(f)` under the
    ensemble's distribution over functions is exactly this pushed-forward ensemble, so a
    scalarisation :math:`w^\top f + b` has mean :math:`w^\top \bar f + b` and the members'
    cross-output covariance in its variance.  :meth:`subset_output` returns a copy exposing some of
    the outputs.

    ``posterior(X, observation_noise=True)`` (or a tensor of noise variances) is the Gaussian
    mixture of the noisy observations, a
    :class:`~gpext.integrations.botorch.NoisyEnsemblePosterior` (see :meth:`posterior`).

    :meth:`condition_on_observations` and :meth:`fantasize` return a
    :class:`~gpext.integrations.botorch.ConditionedEnsembleSurrogate` (a refit-free square-root
    update of the members).

    Subclasses owe ``_members(X) -> Tensor`` mapping ``(N, d)`` inputs to ``(S, N, m)``
    member outputs (differentiable in ``X``), the attributes ``model``, ``_num_outputs`` and
    ``_input_dim``, and optionally ``_fit_wrapped(X, Y, **kwargs)``,
    ``_member_class_probabilities(X)``, ``_noise_variance(X) -> (N, m or 1)`` (the
    observation noise used when conditioning, the members' mean noise) and
    ``_member_noise_variance(X) -> (S or 1, N, m or 1)`` (each member's noise, for
    ``observation_noise=True``; default ``_noise_variance`` for every member).

    Args:
        train_X: Optional training inputs. # shape: (n, d)
        train_Y: Optional training targets. # shape: (n, m)
        input_transform: BoTorch ``InputTransform``.
        outcome_transform: BoTorch ``OutcomeTransform``; member values are untransformed (as in
            ``EnsembleModel.posterior``).
    """

    # outputs of the wrapped model this adapter exposes (set by ``subset_output``; None: all)
    _output_subset: list[int] | None = None
    #: Factor :math:`\kappa` on the members' spread about their mean (set by
    #: :func:`~gpext.integrations.botorch.fit_gpext_surrogate`'s calibration; 1: none).
    epistemic_scale: float = 1.0
    # whether fit_gpext_surrogate calibrates the spread by default (small designs)
    _calibrate_by_default: bool = False

    @property
    def batch_shape(self) -> torch.Size:
        """The adapters hold one (non-batched) ensemble."""
        return torch.Size([])

    @abstractmethod
    def _members(self, X: torch.Tensor) -> torch.Tensor:
        """Member outputs ``(S, N, m)`` at inputs ``(N, d)``."""

    def _fold_copy(self, num_rows: int) -> SampleEnsembleSurrogate:
        """An unfitted copy of this adapter to fit on ``num_rows`` rows (calibration folds of
        :func:`~gpext.integrations.botorch.fit_gpext_surrogate`)."""
        return copy.deepcopy(self)

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        raise NotFittedError(
            f"{type(self).__name__}: fit_gpext_surrogate does not support this adapter; build "
            "it from a fitted model (see its class methods)."
        )

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        """Observation-noise variance ``(N, m or 1)`` at inputs ``(N, d)`` (``None``: no model).

        In the outcome-transformed space; used by :meth:`condition_on_observations`,
        :meth:`fantasize` and, through :meth:`_member_noise_variance`, by :meth:`posterior`.
        """
        return None

    def _member_noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        """Observation-noise variance of each member ``(S or 1, N, m or 1)`` at ``(N, d)``.

        In the outcome-transformed space; used by ``posterior(X, observation_noise=True)``.
        Default: :meth:`_noise_variance` shared by all members (``None``: no noise model).
        """
        noise = self._noise_variance(X)
        return None if noise is None else noise.unsqueeze(0)

    def _exposed_member_noise_variance(self, Xt: torch.Tensor) -> torch.Tensor | None:
        """Members' noise of the exposed outputs at ``(*b, q, d)``: ``(*b, S or 1, q, m or 1)``."""
        flat = Xt.reshape(-1, Xt.shape[-1])
        noise = self._member_noise_variance(flat)
        if noise is None:
            return None
        sub = self._output_subset
        if sub is not None and noise.shape[-1] != 1:
            noise = noise[..., sub]
        noise = noise.expand(noise.shape[0], flat.shape[0], noise.shape[-1])
        return noise.reshape(noise.shape[0], *Xt.shape[:-1], noise.shape[-1]).movedim(0, -3)

    def _exposed_noise_variance(self, Xt: torch.Tensor) -> torch.Tensor | None:
        """The noise variance of the exposed outputs at ``(*b, n, d)``: ``(*b, n, m or 1)``."""
        flat = Xt.reshape(-1, Xt.shape[-1])
        noise = self._noise_variance(flat)
        if noise is None:
            return None
        sub = self._output_subset
        if sub is not None and noise.shape[-1] != 1:
            noise = noise[..., sub]
        noise = noise.expand(flat.shape[0], noise.shape[-1])
        return noise.reshape(*Xt.shape[:-1], noise.shape[-1])

    def condition_on_observations(
        self, X: torch.Tensor, Y: torch.Tensor, noise: torch.Tensor | None = None, **kwargs: Any
    ) -> SampleEnsembleSurrogate:
        r"""The ensemble updated on ``Y = f(X) + eps`` by a refit-free square-root transform.

        Each member becomes a linear combination of the members,
        :math:`f'_s = \sum_t f_t\,\mathrm{M}_{ts}`, chosen so that the updated ensemble's
        mean and (unbiased) covariance are exactly the Gaussian update of the ensemble's own
        moments :math:`(\bar f, \hat C)` on the observations (see
        :class:`~gpext.integrations.botorch.ConditionedEnsembleSurrogate` for the equations
        and the limits of this approximation).  No member is retrained.

        Args:
            X: New inputs. # shape: (*batch_x, n', d)
            Y: Observations in the original outcome space. # shape: (*batch_y, n', m)
            noise: Noise variances in the outcome-transformed space, broadcastable to ``Y``;
                default the adapter's noise model where it has one (VBoot's fitted noise, the
                members' mean predicted variance of a Gaussian network, times its
                ``variance_scale``), else none (a jitter keeps the update stable).
            **kwargs: Ignored.

        Returns:
            A :class:`~gpext.integrations.botorch.ConditionedEnsembleSurrogate` of batch shape
            ``broadcast(batch_x, batch_y)``.

        Raises:
            InputTypeError: If the data are not floating tensors of the model's dtype.
            ShapeError: If the shapes do not match.
            InputDataError: For non-finite data or negative noise.
        """
        from gpext.integrations.botorch.conditioned_ensemble_surrogate import (
            ConditionedEnsembleSurrogate,
        )

        return ConditionedEnsembleSurrogate(self, X, Y, noise)

    def fantasize(
        self,
        X: torch.Tensor,
        sampler: MCSampler,
        observation_noise: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SampleEnsembleSurrogate:
        r"""A fantasy model: the ensemble updated on observations drawn from its own predictive.

        The fantasies depend on the sampler:

        * a normal sampler (``SobolQMCNormalSampler``, ``IIDNormalSampler``; the default of
          ``qKnowledgeGradient`` and ``qNegIntegratedPosteriorVariance``) draws from the
          Gaussian moment-matched to the members plus noise,
          :math:`\mathbf y \sim \mathcal N(\bar f(X), \hat C(X, X) + \Sigma)`, the
          distribution the conditioning assumes;
        * a :class:`~gpext.integrations.botorch.NoisyEnsembleSampler` draws from the Gaussian
          mixture of the noisy observations, ``posterior(X, observation_noise=...)``: a member
          plus its noise (member values alone for a model without a noise model);
        * any other sampler (``IndexSampler``) draws from the ensemble posterior, i.e. member
          values :math:`f_s(X)` (no observation noise).

        Then :meth:`condition_on_observations` on the draws, with noise ``observation_noise``
        if given, else the adapter's noise model.

        Args:
            X: Points to fantasize at. # shape: (*batch, n', d)
            sampler: A BoTorch ``MCSampler``.
            observation_noise: ``None`` or noise variances in the outcome-transformed space of
                shape ``(*batch, 1, m)`` or ``(*batch, n', m)``.
            **kwargs: ``propagate_grads``; the rest goes to :meth:`condition_on_observations`.

        Returns:
            The fantasy model, of batch shape ``sampler.sample_shape x batch``.

        Raises:
            InputTypeError: If ``observation_noise`` is neither ``None`` nor a tensor, or the
                sampler is not an ``MCSampler``.
            ShapeError: If ``X`` or ``observation_noise`` have the wrong shape.
        """

        def draw(Xq: torch.Tensor, obs: torch.Tensor | None) -> torch.Tensor:
            if isinstance(sampler, NoisyEnsembleSampler):
                if obs is None:
                    Xt = self.transform_inputs(Xq)
                    obs = self._exposed_member_noise_variance(Xt) is not None
                return sampler(self.posterior(Xq, observation_noise=obs))
            if not isinstance(sampler, NormalMCSampler):
                return sampler(self.posterior(Xq))
            self.eval()
            Xt = self.transform_inputs(Xq)
            Yt = sampler(self._moment_matched_posterior(Xt, obs))
            octf = getattr(self, "outcome_transform", None)
            return Yt if octf is None else octf.untransform(Yt)[0]

        return run_fantasize(self, X, sampler, observation_noise, draw, kwargs)

    def _moment_matched_posterior(
        self, Xt: torch.Tensor, noise: torch.Tensor | None
    ) -> GPyTorchPosterior:
        r"""Gaussian :math:`\mathcal N(\bar f(X), \hat C(X, X) + \Sigma)` of the members at ``Xt``.

        Joint over the ``n`` points and ``m`` outputs, in the outcome-transformed space
        (``noise``: ``(*b, n, m)`` or ``None`` for the adapter's noise model, or a jitter).
        """
        values = self.forward(Xt)  # shape: (*b, S, n, m)
        s, n, m = values.shape[-3:]
        mean = values.mean(-3)
        dev = (values - mean.unsqueeze(-3)).reshape(*values.shape[:-3], s, n * m)
        cov = dev.mT @ dev / max(s - 1, 1)  # shape: (*b, n m, n m), point-major
        if noise is None:
            noise = self._exposed_noise_variance(Xt)
        var = cov.diagonal(dim1=-2, dim2=-1)
        noise = (var.new_zeros(()) if noise is None else noise).expand(*Xt.shape[:-1], m)
        noise = torch.maximum(noise.reshape(*Xt.shape[:-2], n * m), noise_floor(var))
        cov = cov + torch.diag_embed(noise.expand(var.shape))
        if m == 1:
            dist = MultivariateNormal(mean[..., 0], DenseLinearOperator(cov))
        else:
            dist = MultitaskMultivariateNormal(mean, DenseLinearOperator(cov), interleaved=True)
        return GPyTorchPosterior(distribution=dist)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        r"""Member values at ``X`` (``batch x q x d``), shape ``batch x S x q x m``.

        With an :attr:`epistemic_scale` :math:`\kappa \ne 1` the members are spread about their
        (weighted) mean, :math:`\bar f + \sqrt\kappa\,(f^{(s)} - \bar f)`, so the ensemble's
        variance is :math:`\kappa` times the members' and every sample is still a function.
        With a ``prior_reversion`` submodule (a
        :class:`~gpext.integrations.botorch.PriorReversion`, set by the cross-validated
        calibration of ``fit_weight_ensemble`` and ``fit_gpext_surrogate``), the spread members
        are then combined with the outcome's prior, so that where they disagree more than the
        targets vary their mean reverts to the targets' mean and their spread saturates.
        """
        flat = X.reshape(-1, X.shape[-1])
        out = self._members(flat)  # shape: (S, N, m)
        kappa = float(self.epistemic_scale)
        if kappa != 1.0:
            weights = self.ensemble_weights
            if weights is None:
                center = out.mean(0, keepdim=True)
            else:
                w = (weights / weights.sum()).to(out)
                center = (w.reshape(-1, 1, 1) * out).sum(0, keepdim=True)
            out = center + math.sqrt(kappa) * (out - center)
        reversion = self._modules.get("prior_reversion")
        if reversion is not None:
            out = reversion(out, self.ensemble_weights)
        if self._output_subset is not None:
            out = out[..., self._output_subset]
        out = out.reshape(out.shape[0], *X.shape[:-1], out.shape[-1])
        return out.movedim(0, -3)

    def posterior(
        self,
        X: torch.Tensor,
        output_indices: list[int] | None = None,
        posterior_transform: PosteriorTransform | None = None,
        observation_noise: bool | torch.Tensor = False,
        **kwargs: Any,
    ) -> EnsemblePosterior:
        r"""The ensemble posterior at ``X`` (see ``EnsembleModel.posterior``).

        As in BoTorch's ``EnsembleModel.posterior``, the member values are untransformed by the
        outcome transform, then restricted to ``output_indices``, then passed through
        ``posterior_transform``; here the transform is applied member by member (its
        ``evaluate``), which is the exact posterior of the transformed outputs (see the class).

        ``observation_noise=False`` (default) gives the distribution of the latent function,
        the :class:`~botorch.posteriors.ensemble.EnsemblePosterior` of the members.  With
        observation noise the result is the Gaussian mixture of the noisy observations,
        :class:`~gpext.integrations.botorch.NoisyEnsemblePosterior`,

        .. math::

            p(\mathbf y(X)) = \frac1S \sum_{s=1}^S \mathcal N\big(\mathbf y;\
                f^{(s)}(X),\ \operatorname{diag}\sigma^2_s(X)\big),

        whose ``mean`` is still the member average and whose ``variance`` is the members'
        spread plus their mean noise variance.  ``True`` takes :math:`\sigma^2_s` from the
        adapter's noise model (VBoot's fitted noise, a network's predicted variance per member
        times its variance scale); a tensor of variances is used for every member (BoTorch's
        convention).  Both are in the outcome-transformed space and are mapped to the original
        space by the outcome transform, which must then be linear (e.g. ``Standardize``:
        :math:`\sigma^2 \mapsto \text{std}^2\sigma^2`); a ``posterior_transform`` must then
        be a ``ScalarizedPosteriorTransform`` (noise :math:`\sum_j w_j^2 \sigma^2_{s,j}`, the
        outputs' noise being independent).

        Args:
            X: Query points. # shape: (*batch, q, d)
            output_indices: Outputs to keep (default all).
            posterior_transform: Optional BoTorch ``PosteriorTransform`` (e.g.
                ``ScalarizedPosteriorTransform(weights, offset)`` with ``weights`` of shape
                ``(m,)``, or ``(len(output_indices),)``).
            observation_noise: ``False``, ``True`` (the adapter's noise model) or noise
                variances in the outcome-transformed space. # shape: (*batch, q, m)
            **kwargs: Ignored (BoTorch passes model-specific options here).

        Returns:
            An ``EnsemblePosterior`` (a ``NoisyEnsemblePosterior`` with observation noise) with
            values of shape ``(*batch, S, q, m)`` (``m = 1`` after a scalarising transform).

        Raises:
            InputTypeError: If ``X`` is not a floating tensor of the model's dtype, or
                ``observation_noise`` is neither a bool nor a floating tensor.
            ShapeError: If ``X`` is not ``batch x q x d``, the weights of a
                ``ScalarizedPosteriorTransform`` do not match the number of outputs, or the
                noise tensor is not ``(*batch, q, m)``.
            InputDataError: For non-finite ``X``, invalid ``output_indices``, negative noise,
                ``observation_noise=True`` on a model without a noise model (a classifier),
                or observation noise with a non-linear outcome transform or a posterior
                transform other than ``ScalarizedPosteriorTransform``.
        """
        name = type(self).__name__
        check_query(X, self._input_dim, model_dtype(self.model), f"{name}.posterior(X)")
        if output_indices is not None:
            output_indices = _check_output_indices(
                output_indices, self.num_outputs, f"{name}.posterior(output_indices)"
            )
        posterior = super().posterior(X, output_indices=output_indices, **kwargs)
        noise = self._observation_noise(X, observation_noise, output_indices)
        if posterior_transform is None:
            if noise is None:
                return posterior
            return NoisyEnsemblePosterior(posterior.values, noise, weights=self.ensemble_weights)
        values = posterior.values.contiguous()  # shape: (*batch, S, q, m)
        if isinstance(posterior_transform, ScalarizedPosteriorTransform):
            w = posterior_transform.weights
            if w.shape != values.shape[-1:]:
                raise ShapeError(
                    expected_got(
                        f"{name}.posterior(posterior_transform)",
                        f"ScalarizedPosteriorTransform weights of shape ({values.shape[-1]},) "
                        "(one per output)",
                        tuple(w.shape),
                    )
                )
            if w.dtype != values.dtype or w.device != values.device:
                posterior_transform = ScalarizedPosteriorTransform(
                    w.to(values), offset=posterior_transform.offset
                )
        elif noise is not None:
            raise InputDataError(
                expected_got(
                    f"{name}.posterior(posterior_transform)",
                    "a ScalarizedPosteriorTransform together with observation noise (the "
                    "noise of other transforms is not Gaussian)",
                    type(posterior_transform).__name__,
                    "Pass observation_noise=False, or scalarise the samples in an objective.",
                )
            )
        Xt = self.transform_inputs(X).unsqueeze(-3)  # shape: (*batch, 1, q, d)
        out = posterior_transform.evaluate(values, X=Xt)
        if out.dim() == values.dim() - 1:  # a scalarising transform drops the output dimension
            out = out.unsqueeze(-1)
        if out.dim() != values.dim() or out.shape[:-2] != values.shape[:-2]:
            raise ShapeError(
                expected_got(
                    f"{name}.posterior(posterior_transform)",
                    "a transform whose evaluate maps (*batch, q, m) outcomes to (*batch, q') or "
                    "(*batch, q', m')",
                    f"{tuple(out.shape)} from values of shape {tuple(values.shape)}",
                )
            )
        if noise is None:
            return EnsemblePosterior(values=out, weights=self.ensemble_weights)
        w2 = posterior_transform.weights.to(noise) ** 2
        noise = (noise * w2).sum(-1, keepdim=True)  # independent outputs: sum_j w_j^2 s_j^2
        return NoisyEnsemblePosterior(out, noise, weights=self.ensemble_weights)

    def _observation_noise(
        self,
        X: torch.Tensor,
        observation_noise: object,
        output_indices: list[int] | None,
    ) -> torch.Tensor | None:
        """Noise variances ``(*batch, S or 1, q, m')`` in the original outcome space, or ``None``.

        ``m'`` counts the outputs kept by ``output_indices``; see :meth:`posterior`.
        """
        name = f"{type(self).__name__}.posterior(observation_noise)"
        if observation_noise is False or observation_noise is None:
            return None
        self.eval()
        Xt = self.transform_inputs(X)
        m = self.num_outputs
        if isinstance(observation_noise, torch.Tensor):
            obs = observation_noise
            if not obs.is_floating_point():
                raise InputTypeError(expected_got(name, "a floating tensor", obs.dtype))
            try:
                batch = torch.broadcast_shapes(obs.shape[:-2], X.shape[:-2])
            except RuntimeError:
                batch = None
            if obs.dim() < 2 or obs.shape[-2:] != (X.shape[-2], m) or batch != X.shape[:-2]:
                raise ShapeError(
                    expected_got(
                        name,
                        f"noise variances of shape (*batch, {X.shape[-2]}, {m}) matching "
                        f"X {tuple(X.shape)}",
                        tuple(obs.shape),
                    )
                )
            if not bool(torch.isfinite(obs).all()) or bool((obs < 0).any()):
                raise InputDataError(expected_got(name, "finite non-negative variances", "other"))
            noise = obs.to(Xt).unsqueeze(-3)  # shape: (*batch, 1, q, m)
        elif observation_noise is True:
            noise = self._exposed_member_noise_variance(Xt)
            if noise is None:
                raise InputDataError(
                    f"{name}: expected observation_noise=False, got True; this model has no "
                    "observation-noise model (its outputs are latent functions)."
                )
        else:
            raise InputTypeError(
                expected_got(name, "a bool or a tensor of noise variances", repr(observation_noise))
            )
        noise = noise.expand(*noise.shape[:-1], m)
        octf = getattr(self, "outcome_transform", None)
        if octf is not None:
            if not octf._is_linear:
                raise InputDataError(
                    expected_got(
                        name,
                        "a linear outcome transform (e.g. Standardize) to map the noise to the "
                        "original space",
                        type(octf).__name__,
                        "Use observation_noise=False with this transform.",
                    )
                )
            noise = octf.untransform(torch.zeros_like(noise), noise, X=Xt)[1]
        if output_indices is not None:
            noise = noise[..., output_indices]
        return noise

    def draw_functions(
        self, sample_shape: torch.Size | int = 1, *, generator: torch.Generator | None = None
    ) -> FunctionDrawPath:
        r"""Thompson sampling by function draws: draw ``i`` is one member's function.

        .. math::

            f_i = f^{(s_i)}, \qquad s_i \sim \operatorname{Categorical}(w_1, \dots, w_S)
            \ \text{(uniform unless ``ensemble_weights`` are set)},

        independently for every draw (and every batch element of a conditioned model).  This
        is an exact draw from the ensemble's distribution over functions (the members), the
        same one ``posterior(X).rsample()`` draws at finitely many points, so a draw is the
        same function at every ``X`` (maximise it with ``optimize_acqf``, or use BoTorch's
        ``PathwiseThompsonSampling``, which calls this method through
        ``draw_matheron_paths``).  Draws carry no observation noise, and they hold the
        adapter by reference: they follow the members as they are when evaluated.

        Args:
            sample_shape: Number (or shape) of draws.
            generator: Random generator of the member indices.

        Returns:
            A :class:`~gpext.integrations.botorch.FunctionDrawPath`; ``path.draws.indices``
            holds the chosen members, shape ``(*sample_shape, *batch_shape)``.

        Raises:
            InputTypeError: For a bad ``sample_shape``.
        """
        from gpext.integrations.botorch.function_draw_path import (
            FunctionDrawPath,
            _as_sample_shape,
            _MemberDraws,
        )

        name = f"{type(self).__name__}.draw_functions"
        shape = _as_sample_shape(sample_shape, f"{name}(sample_shape)") + self.batch_shape
        num = self._ensemble_size()
        weights = self.ensemble_weights
        probs = torch.ones(num) if weights is None else weights.detach().double().cpu()
        indices = torch.multinomial(
            probs.expand(shape.numel(), num), 1, replacement=True, generator=generator
        ).reshape(shape)
        draw_shape = shape[: len(shape) - len(self.batch_shape)]
        return FunctionDrawPath(self, _MemberDraws(self, indices), draw_shape)

    def _ensemble_size(self) -> int:
        """Number of members ``S`` (from ``num_members``, else from one evaluation)."""
        num = getattr(self, "num_members", None)
        if num is not None:
            return int(num)
        d = self._input_dim
        if d is None and getattr(self, "train_X", None) is not None:
            d = int(self.train_X.shape[-1])
        dtype, device = model_dtype(self.model), model_device(self.model)
        with torch.no_grad():
            probe = torch.zeros(1, d or 1, dtype=dtype, device=device)
            return int(self.forward(probe).shape[-3])

    def subset_output(self, idcs: list[int]) -> SampleEnsembleSurrogate:
        """A copy of the adapter whose members have only the outputs ``idcs``.

        Args:
            idcs: Output indices in ``[0, num_outputs)``.

        Returns:
            A deep copy with ``num_outputs == len(idcs)``; its posterior equals this model's
            posterior with ``output_indices=idcs``.  A classifier's :meth:`class_probabilities`
            are unaffected (they average the softmax over all classes).

        Raises:
            InputTypeError: If ``idcs`` is not a list of integers.
            InputDataError: If ``idcs`` is empty or out of range.
            NotImplementedError: (BoTorch's) if the outcome transform cannot be subset.
        """
        return _subset_output_copy(self, idcs)

    def class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        """Member-averaged class probabilities (classifiers only); differentiable in ``X``.

        Args:
            X: Query points. # shape: (*batch, q, d)

        Returns:
            Probabilities. # shape: (*batch, q, C)

        Raises:
            InputDataError: For a regression model.
        """
        check_query(
            X,
            self._input_dim,
            model_dtype(self.model),
            f"{type(self).__name__}.class_probabilities(X)",
        )
        self.eval()
        Xt = self.transform_inputs(X)
        flat = Xt.reshape(-1, Xt.shape[-1])
        probs = self._member_class_probabilities(flat).mean(0)  # shape: (N, C)
        return probs.reshape(*X.shape[:-1], probs.shape[-1])

    def _member_class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        raise InputDataError(
            f"{type(self).__name__}.class_probabilities: expected a classifier, got a regression "
            "model."
        )
