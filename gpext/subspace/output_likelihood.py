"""Likelihoods of network outputs used by weight-space inference (training, ESS, VI, BMA)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.fit.standardize import Standardizer

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

    Target transform (regression; the data contract of :class:`gpext.fit.Standardizer`): the
    network's outputs live in standardised units :math:`t = (y - \mu_y) / s_y`, and the
    likelihood maps them to the targets' own units,

    .. math::

        p(y \mid o) = \frac{1}{s_y}\, p_t\big((y - \mu_y) / s_y \mid o\big), \qquad
        \mathbb E[y] = \mu_y + s_y m, \qquad \operatorname{Var}[y] = s_y^2 v,

    with :math:`(m, v)` the mean and variance of :math:`t` read from the output ``o``
    (:meth:`standardized_mean_variance`).  :meth:`mean_variance`, :meth:`log_prob` and
    everything built on them (training, ESS, VI, model averages, held-out tuning) are in the
    targets' units.  The default is the identity (:math:`\mu_y = 0, s_y = 1`);
    :func:`~gpext.subspace.train_sgd_trajectory` fits it on the training targets
    (:meth:`fit_target_transform`) when the likelihood has none yet, unless called with
    ``standardize=False``.  The attributes ``noise_variance`` and ``min_variance`` are in the
    standardised units (the network's), so the defaults (learned noise starting at 1, the
    floor) hold whatever the units of the targets; :attr:`target_noise_variance` is the noise
    in the targets' units, :math:`s_y^2 \sigma^2`.  A *fixed* noise (``"gaussian"``) is
    the exception: it is given in the targets' units and kept there when the transform is
    set (``noise_variance`` becomes :math:`\sigma^2 / s_y^2`).

    .. math::

        \log p(y \mid \mu, \sigma^2) = -\tfrac12 \log(2\pi\sigma^2) - \frac{(y - \mu)^2}{2\sigma^2},
        \qquad
        \hat\sigma^2 = \arg\max_{\sigma^2} \sum_{n=1}^N \log p(y_n \mid \mu_n, \sigma^2)
        = \frac1N \sum_{n=1}^N (y_n - \mu_n)^2

    (the second: :meth:`fit_noise`, the learned noise of ``"homoscedastic_gaussian"``).

    Args:
        kind: One of the four names above.
        noise_variance: Noise variance of ``"gaussian"`` (fixed) and ``"homoscedastic_gaussian"``
            (initial value).  A fixed noise is given in the targets' units and stays fixed
            there: setting a target transform stores it as :math:`\sigma^2 / s_y^2` (as
            BoTorch's ``Standardize`` transforms a known noise).  The initial value of a
            learned noise is in standardised units (1: the targets' whole variance).
        min_variance: Variance floor :math:`\sigma^2_{\min}` of ``"heteroscedastic_gaussian"``
            and of the learned noise of ``"homoscedastic_gaussian"`` (standardised units).
        target_loc: :math:`\mu_y` of the target transform (``None``: no transform yet, the
            identity; set it with ``target_scale``).
        target_scale: :math:`s_y > 0` of the target transform.

    Raises:
        InputDataError: On an unknown kind, a non-positive variance, a categorical kind with a
            target transform, or only one of ``target_loc`` and ``target_scale``.

    Example:
        >>> lik = OutputLikelihood("gaussian", noise_variance=0.1)
        >>> lik.log_prob(torch.zeros(4, 1), torch.ones(4)).shape
        torch.Size([4])
    """

    def __init__(
        self,
        kind: str,
        *,
        noise_variance: float = 1.0,
        min_variance: float = 1e-6,
        target_loc: float | None = None,
        target_scale: float | None = None,
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
        #: :math:`\mu_y` and :math:`s_y` of the target transform (identity: 0 and 1).
        self.target_loc, self.target_scale = 0.0, 1.0
        self._has_target_transform = False
        if (target_loc is None) != (target_scale is None):
            raise InputDataError(
                expected_got("OutputLikelihood(target_loc, target_scale)", "both or neither",
                             (target_loc, target_scale))
            )  # fmt: skip
        if target_loc is not None:
            self.set_target_transform(target_loc, target_scale)

    # ------------------------------------------------------------------ target transform
    @property
    def has_target_transform(self) -> bool:
        """Whether a target transform was set (:meth:`set_target_transform`, :meth:`fit_target_transform`)."""
        return self._has_target_transform

    def set_target_transform(self, loc: float, scale: float) -> OutputLikelihood:
        r"""Set :math:`\mu_y` and :math:`s_y` (``scale`` finite and positive).

        The fixed noise of ``"gaussian"`` keeps its value in the targets' units
        (:attr:`target_noise_variance`); a learned noise keeps its standardised value.

        Returns:
            ``self``.

        Raises:
            InputDataError: For a categorical likelihood, or a non-finite location or a scale
                that is not finite and positive.
        """
        if not self.is_regression:
            raise InputDataError(
                expected_got("OutputLikelihood.set_target_transform", "a regression likelihood",
                             self.kind, "Class labels are not transformed.")
            )  # fmt: skip
        loc, scale = float(loc), float(scale)
        if not (math.isfinite(loc) and math.isfinite(scale) and scale > 0):
            raise InputDataError(
                expected_got("OutputLikelihood target transform", "a finite loc and a finite "
                             "scale > 0", (loc, scale))
            )  # fmt: skip
        if self.kind == "gaussian":  # a fixed noise stays fixed in the targets' units
            self.noise_variance *= (self.target_scale / scale) ** 2
        self.target_loc, self.target_scale = loc, scale
        self._has_target_transform = True
        return self

    def fit_target_transform(self, y: torch.Tensor) -> OutputLikelihood:
        """Set the target transform to the mean and standard deviation of training targets ``y``.

        :class:`gpext.fit.Standardizer`'s statistics (float64; constant targets keep scale 1
        with a :class:`~gpext.errors.DataWarning`).

        Returns:
            ``self``.

        Raises:
            InputDataError: For a categorical likelihood, no targets or non-finite ones.
        """
        if not self.is_regression:
            return self.set_target_transform(0.0, 1.0)  # raises
        y = torch.as_tensor(y).reshape(-1)
        stats = Standardizer(inputs=False, targets=True, name="OutputLikelihood").fit(y, y)
        return self.set_target_transform(float(stats.y_loc[0]), float(stats.y_scale[0]))

    def transform_targets(self, y: torch.Tensor) -> torch.Tensor:
        r"""Targets in standardised units, :math:`(y - \mu_y) / s_y`."""
        if not self._has_target_transform:
            return y
        return (y - self.target_loc) / self.target_scale

    @property
    def target_noise_variance(self) -> float:
        r""":math:`s_y^2 \sigma^2`: :attr:`noise_variance` in the targets' units."""
        return self.target_scale**2 * self.noise_variance

    def state_dict(self) -> dict:
        """The likelihood's settings and fitted state (kind, noise, floor, target transform)."""
        return {
            "kind": self.kind,
            "noise_variance": self.noise_variance,
            "min_variance": self.min_variance,
            "target_transform": (
                (self.target_loc, self.target_scale) if self._has_target_transform else None
            ),
        }

    def load_state_dict(self, state: dict) -> OutputLikelihood:
        """Restore what :meth:`state_dict` saved (the kind must match).

        Raises:
            InputDataError: For a state of another kind.
        """
        if state.get("kind", self.kind) != self.kind:
            raise InputDataError(
                expected_got("OutputLikelihood.load_state_dict", f"a state of kind {self.kind!r}",
                             state.get("kind"))
            )  # fmt: skip
        transform = state.get("target_transform")
        if transform is None:
            self.target_loc, self.target_scale, self._has_target_transform = 0.0, 1.0, False
        else:
            self.set_target_transform(*transform)
        # after the transform: the saved (standardised) values as they are
        self.noise_variance = float(state.get("noise_variance", self.noise_variance))
        self.min_variance = float(state.get("min_variance", self.min_variance))
        return self

    @property
    def learns_noise(self) -> bool:
        """Whether the noise variance is learned (``"homoscedastic_gaussian"``)."""
        return self.kind == "homoscedastic_gaussian"

    @property
    def is_regression(self) -> bool:
        """Whether the targets are real-valued."""
        return self.kind != "categorical"

    def standardized_mean_variance(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance (noise included) in standardised units (the network's).

        Without a target transform this is :meth:`mean_variance`.

        Args:
            output: Raw output. # shape: (..., N, 2), (..., N, 1) or (..., N)

        Returns:
            ``(mean, variance)`` of :math:`t = (y - \\mu_y) / s_y`. # shapes: (..., N), (..., N)

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

    def mean_variance(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance (noise included) of a regression output, in the targets' units.

        :math:`(\\mu_y + s_y m,\\ s_y^2 v)` for the standardised :math:`(m, v)` of
        :meth:`standardized_mean_variance`.

        Args:
            output: Raw output. # shape: (..., N, 2), (..., N, 1) or (..., N)

        Returns:
            ``(mean, variance)``. # shapes: (..., N), (..., N)

        Raises:
            ShapeError: If the output does not fit the kind.
        """
        mean, var = self.standardized_mean_variance(output)
        if not self._has_target_transform:
            return mean, var
        return self.target_loc + self.target_scale * mean, self.target_scale**2 * var

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Log-likelihood of each target.

        With a target transform the density is that of the targets in their own units,
        :math:`\\log p_t((y - \\mu_y) / s_y \\mid o) - \\log s_y`.

        Args:
            output: Raw network output. # shape: (N, 2), (N, 1), (N,) or logits (N, C)
            target: Targets (in their own units). # shape: (N,)

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
        mean, var = self.standardized_mean_variance(output)
        if mean.shape != target.shape:
            raise ShapeError(
                expected_got(
                    "OutputLikelihood(target)", f"shape {tuple(mean.shape)}", tuple(target.shape)
                )
            )
        t = self.transform_targets(target)
        lp = -0.5 * (math.log(2 * math.pi) + var.log() + (t - mean) ** 2 / var)
        return lp - math.log(self.target_scale) if self._has_target_transform else lp

    @torch.no_grad()
    def fit_noise(self, output: torch.Tensor, target: torch.Tensor) -> float:
        r"""Set the noise variance to its maximum-likelihood value for fixed outputs.

        .. math::

            \hat\sigma^2 = \max\Big(\frac1N \sum_{n=1}^N (t_n - m_n)^2,\;
            \sigma^2_{\min}\Big)

        in standardised units (:math:`t_n = (y_n - \mu_y) / s_y`, :math:`m_n` the network's
        mean; without a target transform :math:`t = y`).

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
        mean, _ = self.standardized_mean_variance(output)
        if mean.shape != target.shape or mean.numel() == 0:
            raise ShapeError(
                expected_got(
                    "OutputLikelihood.fit_noise(target)",
                    f"shape {tuple(mean.shape)}, non-empty",
                    tuple(target.shape),
                )
            )
        value = float(((self.transform_targets(target.to(mean)) - mean) ** 2).double().mean())
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
        if self._has_target_transform:
            extra += f", target_loc={self.target_loc:.6g}, target_scale={self.target_scale:.6g}"
        return f"OutputLikelihood({self.kind!r}{extra})"

    def predictive_probs(self, output: torch.Tensor) -> torch.Tensor:
        """Class probabilities of a categorical output. # shape: (..., N, C)"""
        if self.kind != "categorical":
            raise InputDataError("OutputLikelihood.predictive_probs: only for 'categorical'.")
        return torch.softmax(output, dim=-1)
