"""Dirichlet-based classification as heteroscedastic regression, for exact and variational GPs."""

from __future__ import annotations

import math
from typing import Any

import torch
from gpytorch.constraints import Interval
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.likelihoods.gaussian_likelihood import _GaussianLikelihoodBase
from gpytorch.likelihoods.noise_models import HomoskedasticNoise
from gpytorch.priors import Prior
from linear_operator.operators import DiagLinearOperator
from torch.distributions import Normal

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.likelihoods.dirichlet_transform import DirichletTargets, DirichletTransform
from gpext.utils import check_labels

__all__ = ["DirichletTransformLikelihood"]


class DirichletTransformLikelihood(_GaussianLikelihoodBase):
    r"""Gaussian likelihood on Dirichlet-transformed labels with per-point, per-class noise.

    The latent function is a batch of ``C`` GPs, one per class (function distributions with
    batch shape ``(..., C)`` and event shape ``(N,)``).  A label :math:`y_n` is mapped by
    :class:`~gpext.likelihoods.DirichletTransform` to targets :math:`\tilde y_{cn}` and noise
    :math:`\sigma^2_{cn}` (001_...txt, Eqs. 10-11), and

    .. math::
        p(\tilde y_{cn} \mid f_{cn}) = \mathcal N(\tilde y_{cn};\, f_{cn},\, \sigma^2_{cn} + s_c^2),

    with an optional learned extra noise :math:`s_c^2` (``learn_additional_noise``).

    Where the noise comes from, in order: an explicit ``noise=`` keyword (``(..., C, N)``),
    ``labels=`` keyword (transformed with *this* likelihood's ``alpha_epsilon``), integer
    observations passed to :meth:`expected_log_prob` / :meth:`log_marginal` (each minibatch of a
    variational GP thus gets its own points' noise), and last the stored ``train_labels`` when
    the number of points matches.  Float observations are taken as already transformed targets
    of shape ``(..., C, N)``.

    Compared with GPyTorch's ``DirichletClassificationLikelihood``: ``num_classes`` is explicit
    (never ``labels.max() + 1``), new labels honour ``alpha_epsilon``, targets follow the model's
    dtype, minibatches get their own noise, labels may have any batch shape, fantasy
    conditioning works (:meth:`get_fantasy_likelihood` with ``labels=`` or ``noise=``), and
    :meth:`class_probs` gives class probabilities (Eq. 12).

    It derives from GPyTorch's Gaussian likelihood base class only because ``ExactGP`` accepts
    nothing else; every method of that base is overridden.

    Args:
        num_classes: Number of classes ``C``.
        alpha_epsilon: :math:`\alpha_\epsilon` of the transform (default 0.01).
        train_labels: Optional training labels (any shape ``(..., N)``) whose noise is used
            when a call has ``N`` points and no ``labels``/``noise`` keyword.
        learn_additional_noise: Learn an extra homoscedastic noise per class.
        noise_prior: Prior of the extra noise.
        noise_constraint: Constraint of the extra noise (default ``GreaterThan(1e-4)``).

    Example:
        >>> lik = DirichletTransformLikelihood(num_classes=3, train_labels=torch.tensor([0, 1, 2, 1]))
        >>> targets = lik.transformed_targets  # (3, 4): the ExactGP's train_targets
    """

    def __init__(
        self,
        num_classes: int,
        alpha_epsilon: float = 0.01,
        train_labels: torch.Tensor | None = None,
        learn_additional_noise: bool = False,
        noise_prior: Prior | None = None,
        noise_constraint: Interval | None = None,
    ) -> None:
        Likelihood.__init__(self)  # the base's noise_covar is not used
        self.transform = DirichletTransform(num_classes, alpha_epsilon)
        self.num_classes = self.transform.num_classes
        self.second_noise_covar: HomoskedasticNoise | None = None
        if learn_additional_noise:
            self.second_noise_covar = HomoskedasticNoise(
                noise_prior=noise_prior,
                noise_constraint=noise_constraint,
                batch_shape=torch.Size([self.num_classes]),
            )
        labels = None if train_labels is None else self._check_labels(train_labels, "train_labels")
        self.register_buffer("train_labels", labels)
        # label noise of all training points, set by get_fantasy_likelihood(noise=...)
        self.register_buffer("train_noise", None)

    @property
    def alpha_epsilon(self) -> float:
        """:math:`\\alpha_\\epsilon` of the transform."""
        return self.transform.alpha_epsilon

    def _check_labels(self, labels: object, name: str) -> torch.Tensor:
        labels = check_labels(labels, self.num_classes, f"DirichletTransformLikelihood.{name}")
        if labels.dim() == 0:
            raise ShapeError(
                expected_got(f"DirichletTransformLikelihood.{name}", "shape (..., N)", "a scalar")
            )
        return labels

    def _dtype(self) -> torch.dtype:
        if self.second_noise_covar is not None:
            return self.second_noise_covar.raw_noise.dtype
        return torch.get_default_dtype()

    def transform_labels(
        self, labels: torch.Tensor, dtype: torch.dtype | None = None
    ) -> DirichletTargets:
        """Targets and noise of labels in the GP layout ``(..., C, N)``.

        Args:
            labels: Integer labels.  # shape: (..., N)
            dtype: Output dtype (default: the likelihood's parameter dtype).

        Returns:
            :class:`~gpext.likelihoods.DirichletTargets` of shape ``(..., C, N)`` each.
        """
        labels = self._check_labels(labels, "labels")
        return self.transform(labels, dtype=dtype or self._dtype(), class_dim=-2)

    @property
    def transformed_targets(self) -> torch.Tensor:
        """Transformed training targets ``(..., C, N)`` (use them as the ExactGP's targets)."""
        if self.train_labels is None:
            raise InputDataError(
                "DirichletTransformLikelihood.transformed_targets: expected train_labels, got none. "
                "Pass train_labels= at construction or call transform_labels(labels)."
            )
        return self.transform_labels(self.train_labels).targets

    def _fixed_noise(
        self, shape: torch.Size, dtype: torch.dtype, device, labels=None, noise=None
    ) -> torch.Tensor:
        """Label noise of shape ``(..., C, N)`` for a function distribution of ``shape``."""
        name = "DirichletTransformLikelihood"
        if noise is not None:
            noise = torch.as_tensor(noise)
        elif labels is not None:
            noise = self.transform_labels(labels, dtype).noise
        elif self.train_noise is not None and self.train_noise.shape[-1] == shape[-1]:
            noise = self.train_noise
        elif self.train_labels is not None and self.train_labels.shape[-1] == shape[-1]:
            noise = self.transform_labels(self.train_labels, dtype).noise
        else:
            raise InputDataError(
                f"{name}: expected labels= or noise= for {shape[-1]} points, got neither (the "
                "stored train_labels do not match). Pass the labels of these points, or use "
                "class_probs() for predictions."
            )
        noise = noise.to(dtype=dtype, device=device)
        if noise.shape[-2:] != (self.num_classes, shape[-1]):
            raise ShapeError(
                expected_got(
                    f"{name} noise",
                    f"shape (..., {self.num_classes}, {shape[-1]})",
                    tuple(noise.shape),
                )
            )
        return noise

    def _noise(self, shape: torch.Size, dtype: torch.dtype, device, **kwargs: Any) -> torch.Tensor:
        if len(shape) < 2 or shape[-2] != self.num_classes:
            raise ShapeError(
                expected_got(
                    "DirichletTransformLikelihood input",
                    f"a batch of {self.num_classes} outputs, shape (..., {self.num_classes}, N)",
                    tuple(shape),
                    "Use batch_shape=torch.Size([num_classes]) in the mean, kernel and "
                    "variational distribution.",
                )
            )
        noise = self._fixed_noise(shape, dtype, device, kwargs.get("labels"), kwargs.get("noise"))
        if self.second_noise_covar is not None:
            noise = noise + self.second_noise_covar.noise.to(dtype)  # shape: (C, 1)
        return noise

    def _targets_and_noise(
        self, observations: torch.Tensor, shape: torch.Size, dtype, device, kwargs
    ):
        if not torch.is_tensor(observations):
            raise InputTypeError(
                expected_got(
                    "DirichletTransformLikelihood.observations",
                    "a tensor",
                    type(observations).__name__,
                )
            )
        if observations.is_floating_point():
            targets = observations.to(dtype)
            noise = self._noise(shape, dtype, device, **kwargs)
        else:
            labels = self._check_labels(observations, "observations")
            targets, _ = self.transform_labels(labels, dtype)
            noise = self._noise(shape, dtype, device, **{**kwargs, "labels": labels})
        targets = targets.to(device)
        try:
            torch.broadcast_shapes(targets.shape, shape)
        except RuntimeError as err:
            raise ShapeError(
                expected_got(
                    "DirichletTransformLikelihood.observations",
                    f"targets broadcastable to {tuple(shape)}",
                    tuple(targets.shape),
                )
            ) from err
        return targets, noise

    # ------------------------------------------------------------------ GPyTorch API
    def forward(self, function_samples: torch.Tensor, *args: Any, **kwargs: Any) -> Normal:
        """Conditional :math:`p(\\tilde y \\mid f)`; ``function_samples`` has shape ``(..., C, N)``."""
        noise = self._noise(
            function_samples.shape, function_samples.dtype, function_samples.device, **kwargs
        )
        return Normal(function_samples, noise.sqrt())

    def marginal(
        self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any
    ) -> MultivariateNormal:
        """Analytic marginal: ``function_dist`` plus the diagonal label noise."""
        mean = function_dist.mean
        noise = self._noise(mean.shape, mean.dtype, mean.device, **kwargs)
        covar = function_dist.lazy_covariance_matrix + DiagLinearOperator(noise.expand(mean.shape))
        return function_dist.__class__(mean, covar)

    def expected_log_prob(
        self,
        observations: torch.Tensor,
        function_dist: MultivariateNormal,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Closed-form :math:`\\mathbb E_q[\\log p(\\tilde y \\mid f)]` of shape ``(..., C, N)``.

        Args:
            observations: Integer labels ``(..., N)`` or transformed targets ``(..., C, N)``.
            function_dist: :math:`q(f)` with batch shape ``(..., C)``.

        Returns:
            Per class and point expected log-likelihood (the ELBO sums over ``N``; sum the
            loss over classes).
        """
        mean, var = function_dist.mean, function_dist.variance
        targets, noise = self._targets_and_noise(
            observations, mean.shape, mean.dtype, mean.device, kwargs
        )
        return -0.5 * (
            ((targets - mean).square() + var) / noise + noise.log() + math.log(2 * math.pi)
        )

    def log_marginal(
        self,
        observations: torch.Tensor,
        function_dist: MultivariateNormal,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Pointwise log predictive density of the transformed targets, ``(..., C, N)``."""
        mean, var = function_dist.mean, function_dist.variance
        targets, noise = self._targets_and_noise(
            observations, mean.shape, mean.dtype, mean.device, kwargs
        )
        return Normal(mean, (var + noise).sqrt()).log_prob(targets)

    def get_fantasy_likelihood(self, **kwargs: Any) -> DirichletTransformLikelihood:
        """A copy that also knows the label noise of fantasy (conditioning) points.

        Pass ``labels=`` (integer, ``(..., M)``): they are transformed with *this* likelihood's
        ``alpha_epsilon`` and appended to ``train_labels``.  Or pass ``noise=`` (``(..., C, M)``,
        e.g. ``lik.transform_labels(new_labels).noise``), which GPyTorch's
        ``ExactGP.get_fantasy_model(inputs, targets, noise=noise)`` forwards: it is appended to
        the training noise (stored in ``train_noise``).  With an ``ExactGP`` over a batch of
        ``C`` outputs, pass ``inputs`` expanded to ``(C, M, D)``: GPyTorch's fantasy strategy
        takes the batch shape from the inputs, and flattens the ``C`` outputs of shared
        ``(M, D)`` inputs into one (a ``view`` error).

        Raises:
            InputDataError: If ``noise=`` is given but the training noise is unknown (neither
                ``train_labels`` nor ``train_noise`` is set).
        """
        new = super().get_fantasy_likelihood()
        labels, noise = kwargs.get("labels"), kwargs.get("noise")
        if labels is not None:
            labels = self._check_labels(labels, "labels")
            if noise is None:
                noise = self.transform_labels(labels, self._dtype()).noise
            if self.train_labels is not None:
                old = self.train_labels.expand(*labels.shape[:-1], self.train_labels.shape[-1])
                labels = torch.cat([old, labels.to(old.device)], -1)
            new.train_labels = labels
        if noise is not None and (labels is None or self.train_noise is not None):
            noise = torch.as_tensor(noise)
            if self.train_noise is not None:
                old = self.train_noise
            elif self.train_labels is not None:
                old = self.transform_labels(self.train_labels, noise.dtype).noise
            else:
                raise InputDataError(
                    "DirichletTransformLikelihood.get_fantasy_likelihood: expected train_labels "
                    "or train_noise for the existing training points, got neither. Construct the "
                    "likelihood with train_labels=."
                )
            if noise.dim() < 2 or noise.shape[-2] != self.num_classes:
                raise ShapeError(
                    expected_got(
                        "DirichletTransformLikelihood.get_fantasy_likelihood noise",
                        f"shape (..., {self.num_classes}, M)",
                        tuple(noise.shape),
                    )
                )
            batch = torch.broadcast_shapes(old.shape[:-1], noise.shape[:-1])
            old = old.to(noise).expand(*batch, old.shape[-1])
            new.train_noise = torch.cat([old, noise.expand(*batch, noise.shape[-1])], -1)
        return new

    def class_probs(
        self,
        function_dist: MultivariateNormal,
        *,
        method: str = "mc",
        num_samples: int = 1000,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Class probabilities :math:`\\mathbb E[\\mathrm{softmax}(f)]` at the points of ``function_dist``.

        Args:
            function_dist: Latent predictive distribution, batch shape ``(..., C)``, event ``(N,)``.
            method: ``"mc"`` or ``"approx"`` (see :meth:`DirichletTransform.class_probs`).
            num_samples: Monte Carlo draws.
            generator: Random generator for the draws.

        Returns:
            Probabilities.  # shape: (..., N, C)
        """
        mean = function_dist.mean.transpose(-1, -2)
        var = function_dist.variance.transpose(-1, -2)
        return self.transform.class_probs(
            mean, var, method=method, num_samples=num_samples, generator=generator
        )
