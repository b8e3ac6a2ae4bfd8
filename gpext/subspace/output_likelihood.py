"""Likelihoods of network outputs used by weight-space inference (training, ESS, VI, BMA)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpext.errors import InputDataError, ShapeError, expected_got

__all__ = ["OutputLikelihood"]

_KINDS = ("heteroscedastic_gaussian", "gaussian", "homoscedastic_gaussian", "categorical")
#: Kinds with one constant noise variance read from :attr:`OutputLikelihood.noise_variance`.
_CONSTANT_NOISE = ("gaussian", "homoscedastic_gaussian")


class OutputLikelihood:
    r"""Per-point log-likelihood :math:`\log p(y_n \mid f_w(x_n))` of a network's raw output.

    * ``"heteroscedastic_gaussian"``: the output has two columns, mean and raw variance;
      :math:`\sigma^2_n = \operatorname{softplus}(o_{n,2}) + \sigma^2_{\min}` (the convention of
      :class:`gpext.nn.HeteroscedasticMLP`).
    * ``"gaussian"``: one output column (or a vector), fixed noise variance ``noise_variance``.
    * ``"homoscedastic_gaussian"``: as ``"gaussian"``, but the noise variance is learned:
      :func:`~gpext.subspace.train_sgd_trajectory` sets it to the maximum-likelihood value
      :math:`\hat\sigma^2` of the current network after every epoch (:meth:`fit_noise`), and
      :func:`~gpext.subspace.select_noise_variance` tunes it on held-out rows afterwards;
      ``noise_variance`` is its initial value.
    * ``"categorical"``: logits of shape ``(N, C)``, integer targets.

    .. math::

        \log p(y \mid \mu, \sigma^2) = -\tfrac12 \log(2\pi\sigma^2) - \frac{(y - \mu)^2}{2\sigma^2},
        \qquad
        \hat\sigma^2 = \arg\max_{\sigma^2} \sum_{n=1}^N \log p(y_n \mid \mu_n, \sigma^2)
        = \frac1N \sum_{n=1}^N (y_n - \mu_n)^2

    (the second: :meth:`fit_noise`, the learned noise of ``"homoscedastic_gaussian"``).

    Args:
        kind: One of the four names above.
        noise_variance: Noise variance of ``"gaussian"`` (fixed) and ``"homoscedastic_gaussian"``
            (initial value).
        min_variance: Variance floor :math:`\sigma^2_{\min}` of ``"heteroscedastic_gaussian"``
            and of the learned noise of ``"homoscedastic_gaussian"``.

    Raises:
        InputDataError: On an unknown kind or a non-positive variance.

    Example:
        >>> lik = OutputLikelihood("gaussian", noise_variance=0.1)
        >>> lik.log_prob(torch.zeros(4, 1), torch.ones(4)).shape
        torch.Size([4])
    """

    def __init__(
        self, kind: str, *, noise_variance: float = 1.0, min_variance: float = 1e-6
    ) -> None:
        if kind not in _KINDS:
            raise InputDataError(expected_got("OutputLikelihood.kind", f"one of {_KINDS}", kind))
        if not noise_variance > 0 or not min_variance >= 0:
            raise InputDataError(
                expected_got(
                    "OutputLikelihood",
                    "noise_variance > 0 and min_variance >= 0",
                    (noise_variance, min_variance),
                )
            )
        self.kind = kind
        self.noise_variance = float(noise_variance)
        self.min_variance = float(min_variance)

    @property
    def learns_noise(self) -> bool:
        """Whether the noise variance is learned (``"homoscedastic_gaussian"``)."""
        return self.kind == "homoscedastic_gaussian"

    @property
    def is_regression(self) -> bool:
        """Whether the targets are real-valued."""
        return self.kind != "categorical"

    def mean_variance(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance (noise included) of a regression output.

        Args:
            output: Raw output. # shape: (..., N, 2), (..., N, 1) or (..., N)

        Returns:
            ``(mean, variance)``. # shapes: (..., N), (..., N)

        Raises:
            ShapeError: If the output does not fit the kind.
        """
        if self.kind == "heteroscedastic_gaussian":
            if output.dim() < 2 or output.shape[-1] != 2:
                raise ShapeError(
                    expected_got(
                        "OutputLikelihood(output)", "shape (..., N, 2)", tuple(output.shape)
                    )
                )
            return output[..., 0], F.softplus(output[..., 1]) + self.min_variance
        if self.kind in _CONSTANT_NOISE:
            mean = output[..., 0] if output.dim() >= 2 and output.shape[-1] == 1 else output
            return mean, torch.full_like(mean, self.noise_variance)
        raise InputDataError("OutputLikelihood.mean_variance: not defined for 'categorical'.")

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Log-likelihood of each target.

        Args:
            output: Raw network output. # shape: (N, 2), (N, 1), (N,) or logits (N, C)
            target: Targets. # shape: (N,)

        Returns:
            ``log p(y_n | output_n)``. # shape: (N,)
        """
        if self.kind == "categorical":
            if output.dim() != 2 or output.shape[0] != target.shape[0]:
                raise ShapeError(
                    expected_got(
                        "OutputLikelihood(logits)",
                        f"shape ({target.shape[0]}, C)",
                        tuple(output.shape),
                    )
                )
            return -F.cross_entropy(output, target, reduction="none")
        mean, var = self.mean_variance(output)
        if mean.shape != target.shape:
            raise ShapeError(
                expected_got(
                    "OutputLikelihood(target)", f"shape {tuple(mean.shape)}", tuple(target.shape)
                )
            )
        return -0.5 * (math.log(2 * math.pi) + var.log() + (target - mean) ** 2 / var)

    @torch.no_grad()
    def fit_noise(self, output: torch.Tensor, target: torch.Tensor) -> float:
        r"""Set the noise variance to its maximum-likelihood value for fixed outputs.

        .. math::

            \hat\sigma^2 = \max\Big(\frac1N \sum_{n=1}^N (y_n - \mu_n)^2,\;
            \sigma^2_{\min}\Big)

        Args:
            output: Raw network output. # shape: (N, 1) or (N,)
            target: Targets. # shape: (N,)

        Returns:
            :math:`\hat\sigma^2` (also stored in :attr:`noise_variance`).

        Raises:
            InputDataError: For a kind without one constant noise variance, or non-finite
                residuals.
            ShapeError: If output and target disagree.
        """
        if self.kind not in _CONSTANT_NOISE:
            raise InputDataError(
                expected_got("OutputLikelihood.fit_noise", f"a kind in {_CONSTANT_NOISE}",
                             self.kind, "A heteroscedastic network predicts its own noise.")
            )  # fmt: skip
        mean, _ = self.mean_variance(output)
        if mean.shape != target.shape or mean.numel() == 0:
            raise ShapeError(
                expected_got(
                    "OutputLikelihood.fit_noise(target)",
                    f"shape {tuple(mean.shape)}, non-empty",
                    tuple(target.shape),
                )
            )
        value = float(((target.to(mean) - mean) ** 2).double().mean())
        if not math.isfinite(value):
            raise InputDataError(
                "OutputLikelihood.fit_noise: non-finite residuals; check the network and targets."
            )
        self.noise_variance = max(value, self.min_variance, 1e-300)
        return self.noise_variance

    def __repr__(self) -> str:
        extra = (
            f", noise_variance={self.noise_variance:.4g}" if self.kind in _CONSTANT_NOISE else ""
        )
        return f"OutputLikelihood({self.kind!r}{extra})"

    def predictive_probs(self, output: torch.Tensor) -> torch.Tensor:
        """Class probabilities of a categorical output. # shape: (..., N, C)"""
        if self.kind != "categorical":
            raise InputDataError("OutputLikelihood.predictive_probs: only for 'categorical'.")
        return torch.softmax(output, dim=-1)
