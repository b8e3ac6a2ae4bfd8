"""The linearised (GLM) predictive of a Gaussian posterior over subspace coordinates."""

from __future__ import annotations

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.subspace.subspace_model import SubspaceModel, _eval_mode
from gpext.utils import as_model_input, check_finite, check_positive_int

__all__ = ["gaussian_from_samples", "linearized_predictive"]


def gaussian_from_samples(thetas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample mean and covariance (divisor ``S - 1``) of posterior draws, for
    :func:`linearized_predictive` after ESS.

    Args:
        thetas: Draws. # shape: (S, r)

    Returns:
        ``(loc, covariance)``. # shapes: (r,), (r, r)

    Raises:
        ShapeError: On fewer than two draws or a non-matrix.
    """
    if not isinstance(thetas, torch.Tensor) or thetas.dim() != 2 or thetas.shape[0] < 2:
        raise ShapeError(
            expected_got(
                "gaussian_from_samples(thetas)", "a (S, r) tensor with S >= 2",
                getattr(thetas, "shape", type(thetas).__name__),
            )
        )  # fmt: skip
    loc = thetas.mean(0)
    centred = thetas - loc
    return loc, centred.T @ centred / (thetas.shape[0] - 1)


def linearized_predictive(
    model: SubspaceModel,
    x: torch.Tensor,
    loc: torch.Tensor,
    covariance: torch.Tensor,
    *,
    batch_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Gaussian predictive of a regression subspace model, linearised in the coordinates.

    With the network's predictive mean :math:`\mu_\theta(x)` and noise variance
    :math:`\sigma^2_\theta(x)` at :math:`w = \hat w + P^\top\theta` and a Gaussian posterior
    :math:`\theta \sim \mathcal N(m, \Sigma)` (mean-field VI:
    :math:`\Sigma = \operatorname{diag}(s^2)`; ESS: :func:`gaussian_from_samples`), the
    first-order expansion :math:`\mu_\theta(x) \approx \mu_m(x) + J(x)(\theta - m)`,
    :math:`J = \partial\mu_\theta(x)/\partial\theta|_{\theta=m}`, gives the generalised
    linear model (GLM) predictive (Immer et al. 2021)

    .. math::

        p(y \mid x) \approx \mathcal N\big(\mu_m(x),\; J(x)\,\Sigma\,J(x)^\top
        + \kappa\,\sigma^2_m(x)\big),

    with :math:`\kappa` the model's ``variance_scale``. :math:`J` costs ``r`` forward-mode
    passes (:func:`torch.func.jacfwd`), against ``S`` passes for a Monte Carlo mixture; the
    result is one Gaussian per point instead of an ``S``-component mixture. It is exact for a
    network linear in its weights and a homoscedastic likelihood.

    Args:
        model: A regression :class:`SubspaceModel`.
        x: Test inputs. # shape: (N, ...)
        loc: Posterior mean :math:`m`. # shape: (r,)
        covariance: Posterior covariance :math:`\Sigma`, or its diagonal. # shape: (r, r) or (r,)
        batch_size: Test points per Jacobian evaluation.

    Returns:
        ``(mean, variance)``, observation noise included. # shapes: (N,), (N,)

    Raises:
        InputDataError: For a classification likelihood, a covariance that is not symmetric
            positive semi-definite, or non-finite values.
        ShapeError: If ``loc`` or ``covariance`` do not match the rank.

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> from gpext.subspace import FlatParameters, OutputLikelihood
        >>> flat = FlatParameters(net)
        >>> model = SubspaceModel(net, flat.flatten(), torch.eye(3), OutputLikelihood("gaussian", noise_variance=0.1))
        >>> mean, var = linearized_predictive(model, torch.ones(4, 2), torch.zeros(3), torch.ones(3))
        >>> var  # J = [1, 1, 1] for the two weights and the bias: 3 + 0.1
        tensor([3.1000, 3.1000, 3.1000, 3.1000])
    """
    if not isinstance(model, SubspaceModel) or not model.likelihood.is_regression:
        raise InputDataError(
            expected_got(
                "linearized_predictive(model)", "a regression SubspaceModel",
                getattr(getattr(model, "likelihood", None), "kind", type(model).__name__),
            )
        )  # fmt: skip
    r = model.rank
    loc = as_model_input(loc, model.center, "linearized_predictive(loc)")
    covariance = as_model_input(covariance, model.center, "linearized_predictive(covariance)")
    if loc.shape != (r,) or covariance.shape not in ((r,), (r, r)):
        raise ShapeError(
            expected_got(
                "linearized_predictive(loc, covariance)", f"shapes ({r},) and ({r}, {r}) or ({r},)",
                (tuple(loc.shape), tuple(covariance.shape)),
            )
        )  # fmt: skip
    check_finite(loc, "linearized_predictive(loc)")
    check_finite(covariance, "linearized_predictive(covariance)")
    if covariance.dim() == 1:
        if bool((covariance < 0).any()):
            raise InputDataError(
                expected_got("linearized_predictive(covariance)", "non-negative variances",
                             float(covariance.min()))
            )  # fmt: skip
        covariance = torch.diag(covariance)
    else:
        if not torch.allclose(covariance, covariance.T, rtol=1e-6, atol=1e-12):
            raise InputDataError(
                expected_got("linearized_predictive(covariance)", "a symmetric matrix",
                             "an asymmetric one")
            )  # fmt: skip
        low = float(torch.linalg.eigvalsh(covariance).min())
        if low < -1e-8 * max(float(covariance.diagonal().abs().max()), 1e-300):
            raise InputDataError(
                expected_got("linearized_predictive(covariance)", "a positive semi-definite matrix",
                             f"smallest eigenvalue {low:.3g}")
            )  # fmt: skip
    x = model._check_inputs(x, "linearized_predictive(x)")
    batch_size = check_positive_int(batch_size, "linearized_predictive.batch_size")

    def head(theta: torch.Tensor, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model.flat.functional_call(model.weights(theta), xb, buffers=model.bn_buffers)
        mean, var = model.likelihood.mean_variance(out)
        return mean, (mean, var)

    means, variances = [], []
    with _eval_mode(model.module):
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            jac, (mean, noise) = torch.func.jacfwd(head, has_aux=True)(loc, xb)  # (b, r)
            epistemic = ((jac @ covariance) * jac).sum(-1).clamp_min(0.0)
            means.append(mean.detach())
            variances.append((epistemic + model.variance_scale * noise).detach())
    return torch.cat(means), torch.cat(variances)
