"""The linearised (GLM) predictive of a Gaussian posterior over subspace coordinates or weights."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from linear_operator import LinearOperator
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood
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
    model: SubspaceModel | nn.Module,
    x: torch.Tensor,
    loc: torch.Tensor,
    covariance: torch.Tensor | LinearOperator,
    *,
    batch_size: int = 1024,
    likelihood: OutputLikelihood | None = None,
    parameters: ParameterSelection = "all",
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Gaussian predictive of a regression network, linearised in subspace coordinates or weights.

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

    Weight space: ``model`` may also be the network itself (an :class:`torch.nn.Module`, with
    ``likelihood``), and :math:`\theta` is then the flat vector :math:`w` of the parameters
    selected by ``parameters`` (:class:`~gpext.subspace.FlatParameters`: ``"all"``,
    ``"requires_grad"``, ``"last_layer"``, names or a predicate), with a Gaussian
    :math:`w \sim \mathcal N(m, \Sigma)` over them, e.g. a SWAG posterior built from a
    :class:`~gpext.subspace.TrajectoryCollector` with the same selection
    (``loc=swag.mean, covariance=swag.covariance()``).  The other parameters keep the module's
    values, and :math:`J` is taken with respect to the :math:`D` selected weights only: memory
    ``batch_size`` :math:`\times D` for :math:`J` and, for ``covariance`` a
    :class:`~linear_operator.LinearOperator` (SWAG's low-rank-plus-diagonal one), no dense
    :math:`D \times D` matrix; forward mode when :math:`D` is at most the batch's rows, else
    reverse mode (:func:`torch.func.jacrev`).  The last-layer choice gives laplace-torch's
    last-layer GLM predictive.  :math:`\kappa = 1`.

    Args:
        model: A regression :class:`SubspaceModel`, or a network (weight space).
        x: Test inputs. # shape: (N, ...)
        loc: Posterior mean :math:`m`. # shape: (r,) or (D,)
        covariance: Posterior covariance :math:`\Sigma`, or its diagonal, or a
            :class:`~linear_operator.LinearOperator` (e.g. ``swag.covariance()``; taken as
            positive semi-definite). # shape: (r, r), (r,), (D, D) or (D,)
        batch_size: Test points per Jacobian evaluation.
        likelihood: The regression likelihood that reads the network's output (weight space
            only; a :class:`SubspaceModel` has its own).
        parameters: Which parameters :math:`w` holds (weight space).  For a
            :class:`SubspaceModel` the selection is the model's: leave it at ``"all"`` or name
            the same parameters.
        buffers: Buffers used instead of the network's own, e.g. batch-norm statistics
            (weight space; a :class:`SubspaceModel` uses its ``bn_buffers``).

    Returns:
        ``(mean, variance)``, observation noise included. # shapes: (N,), (N,)

    Raises:
        InputDataError: For a classification likelihood, a covariance that is not symmetric
            positive semi-definite, non-finite values, a ``parameters`` selection other than a
            :class:`SubspaceModel`'s, or ``likelihood`` / ``buffers`` with a
            :class:`SubspaceModel`.
        InputTypeError: For a ``model`` that is neither, or weight space without an
            :class:`~gpext.subspace.OutputLikelihood`.
        ShapeError: If ``loc`` or ``covariance`` do not match the rank (the number of selected
            weights).

    Example:
        >>> net = torch.nn.Linear(2, 1)
        >>> from gpext.subspace import FlatParameters, OutputLikelihood
        >>> flat = FlatParameters(net)
        >>> model = SubspaceModel(net, flat.flatten(), torch.eye(3), OutputLikelihood("gaussian", noise_variance=0.1))
        >>> mean, var = linearized_predictive(model, torch.ones(4, 2), torch.zeros(3), torch.ones(3))
        >>> var  # J = [1, 1, 1] for the two weights and the bias: 3 + 0.1
        tensor([3.1000, 3.1000, 3.1000, 3.1000])
        >>> mean, var = linearized_predictive(net, torch.ones(4, 2), torch.zeros(1), torch.ones(1),
        ...     likelihood=OutputLikelihood("gaussian", noise_variance=0.1), parameters=["bias"])
        >>> var  # the bias alone: 1 + 0.1
        tensor([1.1000, 1.1000, 1.1000, 1.1000])
    """
    what = "linearized_predictive"
    if isinstance(model, SubspaceModel):
        _check_subspace_arguments(model, likelihood, parameters, buffers)
        likelihood, flat, ref = model.likelihood, model.flat, model.center
        buffers, kappa, dim = model.bn_buffers, model.variance_scale, model.rank
    elif isinstance(model, nn.Module):
        if not isinstance(likelihood, OutputLikelihood):
            raise InputTypeError(
                expected_got(f"{what}.likelihood", "an OutputLikelihood for a network (weight "
                             "space)", type(likelihood).__name__,
                             "Pass likelihood=OutputLikelihood(...), or a SubspaceModel.")
            )  # fmt: skip
        flat = FlatParameters(model, parameters)
        ref = flat.flatten()
        kappa, dim = 1.0, flat.num_parameters
    else:
        raise InputTypeError(
            expected_got(f"{what}(model)", "a SubspaceModel or a torch.nn.Module",
                         type(model).__name__)
        )  # fmt: skip
    if not likelihood.is_regression:
        raise InputDataError(
            expected_got(f"{what}(model)", "a regression likelihood", likelihood.kind)
        )
    loc = as_model_input(loc, ref, f"{what}(loc)")
    dense = not isinstance(covariance, LinearOperator)
    if dense:
        covariance = as_model_input(covariance, ref, f"{what}(covariance)")
    if loc.shape != (dim,) or tuple(covariance.shape) not in ((dim,), (dim, dim)):
        raise ShapeError(
            expected_got(
                f"{what}(loc, covariance)", f"shapes ({dim},) and ({dim}, {dim}) or ({dim},)",
                (tuple(loc.shape), tuple(covariance.shape)),
            )
        )  # fmt: skip
    check_finite(loc, f"{what}(loc)")
    if dense:
        covariance = _check_covariance(covariance, what)
    if isinstance(model, SubspaceModel):
        x = model._check_inputs(x, f"{what}(x)")
    else:
        x = _check_network_inputs(x, ref, f"{what}(x)")
    batch_size = check_positive_int(batch_size, f"{what}.batch_size")

    if isinstance(model, SubspaceModel):

        def head(theta: torch.Tensor, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = flat.functional_call(model.weights(theta), xb, buffers=buffers)
            mean, var = likelihood.mean_variance(out)
            return mean, (mean, var)

    else:

        def head(theta: torch.Tensor, xb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = flat.functional_call(theta, xb, buffers=buffers)
            mean, var = likelihood.mean_variance(out)
            return mean, (mean, var)

    means, variances = [], []
    with _eval_mode(flat.module):
        for start in range(0, x.shape[0], batch_size):
            xb = x[start : start + batch_size]
            # forward mode costs dim passes, reverse mode one per row: the cheaper of the two
            jac_fn = torch.func.jacfwd if dim <= xb.shape[0] else torch.func.jacrev
            jac, (mean, noise) = jac_fn(head, has_aux=True)(loc, xb)  # (b, dim)
            jac = jac.detach()
            if covariance.dim() == 1:
                epistemic = (jac.pow(2) * covariance).sum(-1)
            elif dense:
                epistemic = ((jac @ covariance) * jac).sum(-1)
            else:
                epistemic = (covariance.matmul(jac.mT).mT * jac).sum(-1)
            means.append(mean.detach())
            variances.append((epistemic.clamp_min(0.0) + kappa * noise).detach())
    return torch.cat(means), torch.cat(variances)


def _check_subspace_arguments(
    model: SubspaceModel,
    likelihood: object,
    parameters: ParameterSelection,
    buffers: object,
) -> None:
    """Refuse weight-space arguments that would contradict a :class:`SubspaceModel`'s own."""
    what = "linearized_predictive"
    for name, value in (("likelihood", likelihood), ("buffers", buffers)):
        if value is not None:
            raise InputDataError(
                expected_got(f"{what}.{name}", "None for a SubspaceModel (it has its own)",
                             type(value).__name__,
                             f"Drop {name}=, or pass the network for a weight-space predictive.")
            )  # fmt: skip
    if isinstance(parameters, str) and parameters == "all":
        return
    names = FlatParameters(model.module, parameters).names
    if names != model.flat.names:
        raise InputDataError(
            expected_got(f"{what}.parameters", f"the SubspaceModel's selection {model.flat.names}",
                         names, "Leave parameters at its default for a SubspaceModel.")
        )  # fmt: skip


def _check_covariance(covariance: torch.Tensor, what: str) -> torch.Tensor:
    """A finite, non-negative diagonal, or a symmetric positive semi-definite matrix."""
    check_finite(covariance, f"{what}(covariance)")
    if covariance.dim() == 1:
        if bool((covariance < 0).any()):
            raise InputDataError(
                expected_got(f"{what}(covariance)", "non-negative variances",
                             float(covariance.min()))
            )  # fmt: skip
        return covariance
    if not torch.allclose(covariance, covariance.T, rtol=1e-6, atol=1e-12):
        raise InputDataError(
            expected_got(f"{what}(covariance)", "a symmetric matrix", "an asymmetric one")
        )
    low = float(torch.linalg.eigvalsh(covariance).min())
    if low < -1e-8 * max(float(covariance.diagonal().abs().max()), 1e-300):
        raise InputDataError(
            expected_got(f"{what}(covariance)", "a positive semi-definite matrix",
                         f"smallest eigenvalue {low:.3g}")
        )  # fmt: skip
    return covariance


def _check_network_inputs(x: object, like: torch.Tensor, name: str) -> torch.Tensor:
    """Network inputs ``(N, ...)`` in the weights' dtype and device: non-empty and finite."""
    x = as_model_input(x, like, name)
    if x.dim() == 0 or x.shape[0] == 0:
        raise InputDataError(
            expected_got(name, "at least one row, shape (N, ...)", f"shape {tuple(x.shape)}")
        )
    check_finite(x, name)
    return x
