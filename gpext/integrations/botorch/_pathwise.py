r"""Pathwise function draws of an inducing-point Gaussian posterior (random-feature prior).

Wilson et al. (2020, 2021, "Pathwise conditioning of Gaussian processes", Eqs. 13 and 17):
a posterior of the form

.. math::

    f \mid \mathcal D \sim \mathcal{GP}\big(\mu(x),\ s^2\,[\,k(x, x') - k_{xZ}K_{ZZ}^{-1}k_{Zx'}
        + k_{xZ} L L^\top k_{Zx'}\,]\big)

is sampled as a function by

.. math::

    f(x) = \mu(x) + s\,\big(f_0(x) - k_{xZ}K_{ZZ}^{-1} f_0(Z) + k_{xZ} L\boldsymbol\varepsilon\big),
    \qquad f_0 \sim \mathcal{GP}(0, k),\ \boldsymbol\varepsilon \sim \mathcal N(0, I),

with the prior draw :math:`f_0(x) \approx \phi(x)^\top \mathbf w`,
:math:`\mathbf w \sim \mathcal N(0, I)`, from BoTorch's random Fourier features of ``k``
(``botorch.sampling.pathwise.features.gen_kernel_features``).  The update term is exact; the
draw's covariance differs from the posterior's only through the random-feature approximation
of :math:`k` (error :math:`O(F^{-1/2})` for ``F`` features) and through the jitter on
:math:`K_{ZZ}`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from botorch.sampling.pathwise.features import gen_kernel_features
from gpytorch.kernels import Kernel
from torch import nn

from gpext.errors import InputDataError, expected_got
from gpext.utils import check_positive_int, safe_cholesky

__all__ = ["InducingPointPath"]


class InducingPointPath(nn.Module):
    r"""Draws of a single-output inducing-point posterior as functions (see the module).

    Args:
        kernel: The prior kernel :math:`k` (RBF, Matern, scaled or sums / products of these:
            whatever ``gen_kernel_features`` supports), no batch shape.
        inducing_points: :math:`Z` in the kernel's input space. # shape: (M, d_z)
        sample_shape: Shape of the draws.
        num_features: Number ``F`` of random features (even).
        jitter: Jitter on :math:`K_{ZZ}` (as the model's own posterior uses it).
        features: Map from the path's inputs to the kernel's inputs (default identity).
        mean: :math:`\mu` on the path's inputs (default 0).
        targets: Pseudo-targets :math:`\mathbf r` at ``Z`` such that the mean is
            :math:`k_{xZ}K_{ZZ}^{-1}\mathbf r` (added to :math:`\mu`). # shape: (M,)
        lower: :math:`L` of the variational covariance term (default none). # shape: (M, M)
        scale: :math:`s` (square root of a temperature).
        generator: Random generator of the draws.

    Raises:
        InputDataError: For a kernel with a batch shape or one BoTorch cannot represent with
            random features, or an odd ``num_features``.
    """

    def __init__(
        self,
        kernel: Kernel,
        inducing_points: torch.Tensor,
        *,
        sample_shape: torch.Size,
        num_features: int = 1024,
        jitter: float = 0.0,
        features: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
        targets: torch.Tensor | None = None,
        lower: torch.Tensor | None = None,
        scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        num_features = check_positive_int(num_features, "num_features", minimum=2)
        if num_features % 2:
            raise InputDataError(
                expected_got("num_features", "an even number (sine-cosine pairs)", num_features)
            )
        if len(kernel.batch_shape) != 0:
            raise InputDataError(
                expected_got(
                    "InducingPointPath.kernel",
                    "a kernel without batch shape (one latent function)",
                    f"batch shape {tuple(kernel.batch_shape)}",
                )
            )
        z = inducing_points.detach()
        dtype, device = z.dtype, z.device
        # BoTorch draws the frequencies from the global generator: seed it from ours
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                feature_map = gen_kernel_features(
                    kernel, num_inputs=z.shape[-1], num_outputs=num_features
                )
        except (NotImplementedError, TypeError) as err:
            raise InputDataError(
                expected_got(
                    "pathwise function draws",
                    "a kernel BoTorch's gen_kernel_features supports (RBF, Matern, ScaleKernel, "
                    "sums and products of these)",
                    type(kernel).__name__,
                    "Use MaxPosteriorSampling on a finite candidate set instead (exact joint "
                    "draws).",
                )
            ) from err
        self.feature_map = feature_map
        self.kernel = kernel
        self.features = features
        self.mean = mean
        self.scale = float(scale)
        self.register_buffer("inducing_points", z)
        f = feature_map.num_outputs
        weights = torch.randn(*sample_shape, f, 1, generator=generator, dtype=dtype)
        #: Prior weights :math:`\mathbf w`. # shape: (*sample_shape, F, 1)
        self.register_buffer("weights", weights.to(device))
        with torch.no_grad():
            kzz = kernel(z).to_dense()
            chol = safe_cholesky(kzz, jitter=jitter, name="InducingPointPath K_ZZ")
            f0z = feature_map(z) @ self.weights  # shape: (*sample, M, 1)
            rhs = self.scale * f0z
            if targets is not None:
                rhs = rhs - targets.detach().to(rhs).unsqueeze(-1)
            alpha = torch.cholesky_solve(rhs, chol)
            if lower is not None:
                eps = torch.randn(*sample_shape, z.shape[-2], 1, generator=generator, dtype=dtype)
                alpha = alpha - self.scale * (lower.detach() @ eps.to(device))
        #: :math:`K_{ZZ}^{-1}(s f_0(Z) - \mathbf r) - s L\boldsymbol\varepsilon`.
        #: # shape: (*sample_shape, M, 1)
        self.register_buffer("alpha", alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The draws at ``x`` (draw dimensions broadcast with ``x``'s batch dimensions).

        Args:
            x: Inputs. # shape: (*batch, n, d)

        Returns:
            Values. # shape: (*broadcast(sample_shape, batch), n)
        """
        h = x if self.features is None else self.features(x)
        f0 = self.feature_map(h) @ self.weights  # shape: (*B, n, 1)
        kxz = self.kernel(h, self.inducing_points).to_dense()  # shape: (*b, n, M)
        out = (self.scale * f0 - kxz @ self.alpha).squeeze(-1)
        if self.mean is not None:
            out = out + self.mean(x)
        return out
