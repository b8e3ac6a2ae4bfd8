"""The Dirichlet label transformation (Milios et al. 2018), usable by GP and non-GP models."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_finite, check_labels, check_positive_int

__all__ = ["DirichletTargets", "DirichletTransform"]

_PROB_METHODS = ("mc", "approx")


class DirichletTargets(NamedTuple):
    """Transformed regression targets and their per-point, per-class noise variances."""

    targets: torch.Tensor  # shape: (..., N, C) or (..., C, N)
    noise: torch.Tensor  # shape: like targets


class DirichletTransform:
    r"""Map class labels to Gaussian regression targets with heteroscedastic noise.

    A label :math:`k` becomes Dirichlet parameters :math:`\alpha_i = [i = k] + \alpha_\epsilon`
    (001_...txt, Eq. 10); each Gamma marginal is moment-matched by a log-normal, giving the
    regression target and noise variance of class :math:`i` (Eq. 11):

    .. math::
        \sigma_i^2 = \log(1 / \alpha_i + 1), \qquad \tilde y_i = \log \alpha_i - \sigma_i^2 / 2.

    Class probabilities are :math:`\mathbb E[\mathrm{softmax}(\mathbf f)]` under independent
    Gaussian latents (Eq. 12), by Monte Carlo (:meth:`class_probs` with ``method="mc"``) or by a
    deterministic approximation (``method="approx"``): the sum :math:`\sum_{j \ne i} e^{f_j}` is
    moment-matched by one log-normal (Fenton-Wilkinson), which reduces
    :math:`\mathbb E[1 / (1 + \sum_{j \ne i} e^{f_j - f_i})]` to the expectation of a logistic
    sigmoid of one Gaussian, computed by 32-point Gauss-Hermite quadrature; the result is
    renormalised.  Its error against Monte Carlo is measured in
    ``tests/likelihoods/test_dirichlet_transform.py`` and in ``benchmarks/classification.py``.

    The transform itself has no learnable state; it only needs ``num_classes`` (never inferred
    from the labels) and ``alpha_epsilon``.

    Args:
        num_classes: Number of classes ``C >= 2``.
        alpha_epsilon: :math:`\alpha_\epsilon > 0` (default 0.01; 0.001 suits many-class sets).

    Raises:
        InputDataError: If ``alpha_epsilon`` is not positive or ``num_classes < 2``.

    Example:
        >>> t = DirichletTransform(num_classes=3)
        >>> targets, noise = t(torch.tensor([0, 2]))
        >>> targets.shape, noise.shape
        (torch.Size([2, 3]), torch.Size([2, 3]))
    """

    def __init__(self, num_classes: int, alpha_epsilon: float = 0.01) -> None:
        self.num_classes = check_positive_int(
            num_classes, "DirichletTransform.num_classes", minimum=2
        )
        alpha_epsilon = float(alpha_epsilon)
        if not (alpha_epsilon > 0.0 and math.isfinite(alpha_epsilon)):
            raise InputDataError(
                expected_got(
                    "DirichletTransform.alpha_epsilon", "a positive finite number", alpha_epsilon
                )
            )
        self.alpha_epsilon = alpha_epsilon

    def __repr__(self) -> str:
        return f"DirichletTransform(num_classes={self.num_classes}, alpha_epsilon={self.alpha_epsilon})"

    # ---------------------------------------------------------------- the transform
    def values(self) -> dict[str, float]:
        """Targets and noise for the labelled class (``pos``) and every other class (``neg``)."""
        out = {}
        for key, alpha in (("pos", 1.0 + self.alpha_epsilon), ("neg", self.alpha_epsilon)):
            s2 = math.log1p(1.0 / alpha)
            out[f"{key}_noise"] = s2
            out[f"{key}_target"] = math.log(alpha) - 0.5 * s2
        return out

    def alpha(self, labels: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Dirichlet parameters of each label (Eq. 10).

        Args:
            labels: Integer labels in ``[0, C)`` of any shape.
            dtype: Floating dtype of the result.

        Returns:
            :math:`\\alpha`.  # shape: (*labels.shape, C)
        """
        labels = check_labels(labels, self.num_classes, "DirichletTransform.labels")
        onehot = torch.nn.functional.one_hot(labels, self.num_classes).to(dtype)
        return onehot + self.alpha_epsilon

    def __call__(
        self, labels: torch.Tensor, *, dtype: torch.dtype = torch.float64, class_dim: int = -1
    ) -> DirichletTargets:
        """Transformed targets and noise variances (Eq. 11).

        Args:
            labels: Integer labels in ``[0, C)`` of any shape ``L``.
            dtype: Floating dtype of the outputs (pass the model's dtype).
            class_dim: ``-1`` gives shape ``(*L, C)``; ``-2`` moves the class dimension before
                the data dimension, ``(*L[:-1], C, L[-1])``, the layout of a batch of ``C``
                GPyTorch outputs.

        Returns:
            :class:`DirichletTargets` ``(targets, noise)``.

        Raises:
            InputDataError: If a label is outside ``[0, C)``.
            InputTypeError: If the labels are not whole numbers.
        """
        if class_dim not in (-1, -2):
            raise InputDataError(
                expected_got("DirichletTransform.class_dim", "-1 or -2", class_dim)
            )
        alpha = self.alpha(labels, dtype=dtype)
        noise = torch.log1p(alpha.reciprocal())
        targets = alpha.log() - 0.5 * noise
        if class_dim == -2:
            if alpha.dim() < 2:
                raise ShapeError(
                    expected_got("DirichletTransform.labels", "at least one dimension", "a scalar")
                )
            targets, noise = (
                targets.transpose(-1, -2).contiguous(),
                noise.transpose(-1, -2).contiguous(),
            )
        return DirichletTargets(targets, noise)

    # ---------------------------------------------------------- class probabilities
    def class_probs(
        self,
        mean: torch.Tensor,
        variance: torch.Tensor,
        *,
        method: str = "mc",
        num_samples: int = 1000,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        r"""Class probabilities :math:`\mathbb E[\mathrm{softmax}(\mathbf f)]` (Eq. 12).

        Args:
            mean: Latent means, classes last.  # shape: (..., C)
            variance: Latent variances (independent across classes).  # shape: (..., C)
            method: ``"mc"`` (Monte Carlo, ``num_samples`` draws) or ``"approx"``
                (deterministic log-normal approximation, see the class docstring).
            num_samples: Monte Carlo draws (``method="mc"``).
            generator: Random generator for the draws (on the device of ``mean``).

        Returns:
            Probabilities that sum to one over the last dimension.  # shape: (..., C)

        Raises:
            ShapeError: If the shapes differ or the last dimension is not ``C``.
            InputDataError: If ``method`` is unknown or the inputs are not finite.
        """
        if mean.shape != variance.shape or mean.shape[-1:] != (self.num_classes,):
            raise ShapeError(
                expected_got(
                    "DirichletTransform.class_probs",
                    f"mean and variance of the same shape (..., {self.num_classes})",
                    f"{tuple(mean.shape)} and {tuple(variance.shape)}",
                )
            )
        check_finite(mean, "DirichletTransform.class_probs.mean")
        check_finite(variance, "DirichletTransform.class_probs.variance")
        variance = variance.clamp_min(0.0)
        if method == "mc":
            return _softmax_mc(
                mean, variance, check_positive_int(num_samples, "num_samples"), generator
            )
        if method == "approx":
            return _softmax_lognormal_approx(mean, variance)
        raise InputDataError(
            expected_got("DirichletTransform.class_probs.method", f"one of {_PROB_METHODS}", method)
        )


def _softmax_mc(
    mean: torch.Tensor, variance: torch.Tensor, num_samples: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Monte Carlo average of softmax over Gaussian draws, in blocks to bound memory."""
    sd = variance.sqrt()
    block = max(1, min(num_samples, 2**24 // max(1, mean.numel())))
    acc = torch.zeros_like(mean)
    done = 0
    while done < num_samples:
        s = min(block, num_samples - done)
        z = torch.randn((s, *mean.shape), dtype=mean.dtype, device=mean.device, generator=generator)
        acc = acc + torch.softmax(mean + sd * z, dim=-1).sum(0)
        done += s
    return acc / num_samples


def _softmax_lognormal_approx(mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    r"""Deterministic approximation of :math:`\mathbb E[\mathrm{softmax}(\mathbf f)]`.

    For class :math:`i`, :math:`R_i = \sum_{j \ne i} e^{f_j}` is replaced by a log-normal with the
    same mean :math:`E_i` and variance :math:`V_i` (Fenton-Wilkinson): :math:`\log R_i \sim
    \mathcal N(\log E_i - s_i^2/2, s_i^2)`, :math:`s_i^2 = \log(1 + V_i / E_i^2)`.  Then
    :math:`p_i = \mathbb E[\sigma(f_i - \log R_i)]` with :math:`f_i - \log R_i` Gaussian, a
    one-dimensional integral done by Gauss-Hermite quadrature.  All sums are log-sum-exps.
    """
    c = mean.shape[-1]
    eye = torch.eye(c, dtype=torch.bool, device=mean.device)
    log_e1 = (
        (mean + 0.5 * variance).unsqueeze(-2).expand(*mean.shape, c).masked_fill(eye, -math.inf)
    )
    log_e = torch.logsumexp(log_e1, -1)  # log E_i, shape: (..., C)
    # log of Var[e^{f_j}] = e^{2m + v} (e^v - 1); expm1 clamped away from 0 for v -> 0
    log_var_j = (
        2.0 * mean
        + variance
        + torch.log(torch.expm1(variance).clamp_min(torch.finfo(mean.dtype).tiny))
    )
    log_v = torch.logsumexp(
        log_var_j.unsqueeze(-2).expand(*mean.shape, c).masked_fill(eye, -math.inf), -1
    )
    s2 = torch.log1p(torch.exp(log_v - 2.0 * log_e))
    mu = mean - log_e + 0.5 * s2
    var = variance + s2
    nodes, weights = np.polynomial.hermite.hermgauss(32)
    xi = torch.as_tensor(nodes, dtype=mean.dtype, device=mean.device)
    w = torch.as_tensor(weights / math.sqrt(math.pi), dtype=mean.dtype, device=mean.device)
    x = mu.unsqueeze(-1) + torch.sqrt(2.0 * var).unsqueeze(-1) * xi
    log_p = torch.logsumexp(torch.nn.functional.logsigmoid(x) + w.log(), -1)
    return torch.softmax(log_p, dim=-1)
