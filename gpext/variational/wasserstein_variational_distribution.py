r"""The learnable covariance factor of GWI's variational measure.

GWI (003_4a6349f7433d9fd1.txt, section 2; REFERENCES.md) uses the variational kernel

.. math::

    r(x, x') = k(x, x') - k_{xZ} K_{ZZ}^{-1} k_{Zx'} + k_{xZ} L L^\top k_{Zx'},

so :math:`\mathbb Q` is determined by its mean function and the lower-triangular :math:`L`.
:class:`WassersteinVariationalDistribution` holds :math:`L`.  As a distribution it is
:math:`\mathcal N(0, L L^\top)` over the coefficients :math:`a` of the representation
:math:`f_Q(x) = m_Q(x) + \big(f_P(x) - m_P(x) - k_{xZ}K_{ZZ}^{-1}(f_P(Z) - m_P(Z))\big) + k_{xZ} a`,
i.e. the inducing values are :math:`u = f_Q(Z) = m_Q(Z) + K_{ZZ} a`.
"""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational import _VariationalDistribution
from linear_operator.operators import CholLinearOperator, TriangularLinearOperator

from gpext.errors import InputDataError, expected_got
from gpext.utils import check_positive_int

__all__ = ["WassersteinVariationalDistribution"]


class WassersteinVariationalDistribution(_VariationalDistribution):
    r"""Lower-triangular factor :math:`L` of GWI's variational kernel.

    .. math::

        r(x, x') = k(x, x') - k_{xZ} K_{ZZ}^{-1} k_{Zx'} + k_{xZ} L L^\top k_{Zx'}

    Parameterisation: :math:`L = L_0 T` with a fixed lower-triangular base factor :math:`L_0`
    (buffer ``base_factor``, set by the initialisation) and the learnable lower-triangular
    :math:`T` (parameter ``chol_factor``, the identity after initialisation).  The product of
    lower-triangular matrices is lower triangular and :math:`L L^\top` still ranges over all
    PSD matrices, so the family of :math:`\mathbb Q` is unchanged; what changes is the scale of
    the optimisation: the entries of :math:`\operatorname{chol}((K_{ZZ} +
    K_{ZX}K_{XZ}/\sigma^2)^{-1})` are of order :math:`\sigma / \sqrt N` (1e-3 to 1e-2 on
    standardised data), so a first-order optimiser with a step of 1e-2 on :math:`L` itself
    inflates the covariance of :math:`\mathbb Q` many times over in its first steps, whereas
    a step on :math:`T` changes :math:`L` by a relative amount.  Only the lower triangles of
    both matrices are used.  Initialisation: by default (called by the
    strategy with the prior over the inducing values) :math:`L = \operatorname{chol}(K_{ZZ}^{-1})`,
    for which :math:`r = k` and :math:`\mathbb Q` has the prior covariance; with data,
    :meth:`initialize_from_data` sets
    :math:`L = \operatorname{chol}\big((K_{ZZ} + K_{ZX}K_{XZ}/\sigma^2)^{-1}\big)`, the
    covariance of the optimal sparse Gaussian-regression posterior (REFERENCES.md).

    Args:
        num_inducing_points: Number of inducing points ``M``.
        batch_shape: Batch shape (e.g. ``torch.Size([J])`` for ``J`` latent functions).
        mean_init_std: Unused scale kept for GPyTorch's constructor signature; the factor starts
            at the identity until initialised.

    Example:
        >>> dist = WassersteinVariationalDistribution(16)
        >>> dist.chol_factor.shape
        torch.Size([16, 16])
    """

    def __init__(
        self,
        num_inducing_points: int,
        batch_shape: torch.Size = torch.Size([]),  # noqa: B008
        mean_init_std: float = 1e-3,
        **kwargs,
    ):
        num_inducing_points = check_positive_int(num_inducing_points, "num_inducing_points")
        super().__init__(num_inducing_points, batch_shape=batch_shape, mean_init_std=mean_init_std)
        eye = torch.eye(num_inducing_points).repeat(*batch_shape, 1, 1)
        self.register_parameter("chol_factor", torch.nn.Parameter(eye))
        self.register_buffer("base_factor", eye.clone())

    @property
    def lower(self) -> torch.Tensor:
        """The factor ``L = tril(L_0) tril(T)`` (lower triangular). # shape: (*batch, M, M)"""
        return self.base_factor.tril() @ self.chol_factor.tril()

    def forward(self) -> MultivariateNormal:
        """:math:`\\mathcal N(0, L L^\\top)` over the coefficients ``a``."""
        lower = self.lower
        mean = torch.zeros(lower.shape[:-1], dtype=lower.dtype, device=lower.device)
        return MultivariateNormal(mean, CholLinearOperator(TriangularLinearOperator(lower)))

    def _set_from_precision(self, precision: torch.Tensor) -> None:
        # L L^T = precision^{-1}: factor the precision, invert, refactor.
        from gpext.variational.wasserstein_distance import safe_cholesky

        eye = torch.eye(precision.shape[-1], dtype=precision.dtype, device=precision.device)
        chol = safe_cholesky(precision, jitter=0.0, name="WassersteinVariationalDistribution")
        cov = torch.cholesky_inverse(chol)
        jitter = 1e-10 * cov.diagonal(dim1=-2, dim2=-1).mean()
        lower = safe_cholesky(cov + jitter * eye, jitter=0.0, name="(K_ZZ + ...)^{-1}")
        with torch.no_grad():
            self.base_factor.copy_(lower.expand_as(self.base_factor))
            self.chol_factor.copy_(torch.eye(lower.shape[-1]).to(self.chol_factor))

    def initialize_variational_distribution(self, prior_dist: MultivariateNormal) -> None:
        """Set ``L = chol(K_ZZ^{-1})`` from the prior over the inducing values (then ``r = k``)."""
        kzz = prior_dist.covariance_matrix.detach()
        kzz = kzz.expand(*self.batch_shape, *kzz.shape[-2:]) if self.batch_shape else kzz
        self._set_from_precision(kzz.to(self.chol_factor))

    def initialize_from_data(
        self, kzz: torch.Tensor, kzx: torch.Tensor, noise_variance: float | torch.Tensor
    ) -> None:
        r"""Set :math:`L = \operatorname{chol}\big((K_{ZZ} + K_{ZX}K_{XZ}/\sigma^2)^{-1}\big)`.

        Args:
            kzz: Prior Gram matrix of the inducing points. # shape: (*batch, M, M)
            kzx: Prior cross-covariance to (a subset of) the training inputs. # shape: (*batch, M, N)
            noise_variance: Observation-noise variance :math:`\sigma^2 > 0`.

        Raises:
            InputDataError: If ``noise_variance`` is not positive.
        """
        s2 = torch.as_tensor(noise_variance, dtype=kzz.dtype, device=kzz.device)
        if not bool((s2 > 0).all()):
            raise InputDataError(
                expected_got("noise_variance", "a positive variance", float(s2.min()))
            )
        precision = kzz + (kzx @ kzx.mT) / s2.reshape(*s2.shape, 1, 1)
        self._set_from_precision(precision.detach().to(self.chol_factor))
