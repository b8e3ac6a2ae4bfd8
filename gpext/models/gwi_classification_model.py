r"""GWI multiclass classification with the robust-max likelihood.

``J`` independent latent functions :math:`F_j \sim \mathbb Q_j = \mathcal{GP}(m_{Q,j}, r_j)`
(one shared prior kernel), robust-max likelihood, objective (003_4a6349f7433d9fd1.txt
section 2.1)

.. math::

    \mathcal L = -\sum_n \Big[\log(1-\epsilon) S(x_n, y_n)
        + \log\tfrac{\epsilon}{J-1}\big(1 - S(x_n, y_n)\big)\Big]
        + \sum_{j=1}^J W_2^2(\mathbb P_j, \mathbb Q_j),

and prediction :math:`\mathbb Q(Y_* = j) = (1-\epsilon) S(x_*, j) + \frac{\epsilon}{J-1}(1 - S(x_*, j))`
(003 section 2.2), tempered as :math:`\propto \mathbb Q(Y_* = j)^{1/T}`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.fit import Standardizer
from gpext.models.greedy_inducing_subset import _check_inducing_choice, _inducing_indices
from gpext.models.gwi_exact_prior import fit_exact_prior
from gpext.models.gwi_model import GWIModel
from gpext.nn import SmallCNN
from gpext.utils import (
    as_model_input,
    check_finite,
    check_labels,
    check_positive_int,
)
from gpext.utils.validation import as_fit_input, check_rows
from gpext.variational import WassersteinNetworkMean

__all__ = ["GWIClassificationModel"]


class GWIClassificationModel(GWIModel):
    r"""GWI for multiclass classification with the robust-max likelihood (003 section 2).

    .. math::

        \mathbb Q(Y_* = j) = (1-\epsilon) S(x_*, j) + \frac{\epsilon}{J-1}\big(1 - S(x_*, j)\big)

    The model's output is a batch :class:`~gpytorch.distributions.MultivariateNormal` of shape
    ``(J, N)`` (the latent functions as the last batch dimension), the input format of
    :class:`gpext.likelihoods.RobustMaxLikelihood`.

    Args: see :class:`~gpext.models.gwi_model.GWIModel` (``num_latents`` = number of classes).

    Example:
        >>> import torch
        >>> from gpext.models import GWIClassificationModel
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.randn(40, 2, generator=g)
        >>> train_y = (train_x[:, 0] > 0).long() + (train_x[:, 1] > 0).long()  # 3 classes
        >>> model, likelihood = GWIClassificationModel.from_data(
        ...     train_x, train_y, num_classes=3, generator=g)
        >>> result = model.fit(likelihood, train_x, train_y, epochs=5)
        >>> probs = model.predict_proba(likelihood, torch.randn(5, 2, generator=g))
        >>> probs.shape
        torch.Size([5, 3])
    """

    _standardize_targets = False

    @classmethod
    def from_data(
        cls,
        x: torch.Tensor,
        y: torch.Tensor,
        num_classes: int,
        *,
        num_inducing: int | None = None,
        prior_points: int = 1000,
        prior_steps: int = 60,
        mean_module: torch.nn.Module | None = None,
        image_shape: Sequence[int] | None = None,
        epsilon: float = 0.01,
        prior_outputscale: float | None = 1.0,
        num_subsample: int = 100,
        learn_inducing_locations: bool = False,
        inducing: str = "greedy",
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
        standardize: bool = True,
    ):
        r"""Build a model: exact-GP prior on centred one-hot labels, ``Z`` = data points.

        The prior kernel is fitted by exact GP regression of the centred one-hot labels (one
        shared scaled RBF kernel, zero prior mean) on a subset and frozen; ``L`` starts at
        :math:`\operatorname{chol}((K_{ZZ} + K_{ZX}K_{XZ}/\sigma^2)^{-1})`.  The mean
        :math:`m_Q` is an MLP, or a :class:`gpext.nn.SmallCNN` (its default widths) when
        ``image_shape`` is given.

        Args:
            x: Training inputs. # shape: (N, D)
            y: Labels in ``[0, J)``. # shape: (N,)
            num_classes: ``J``.
            num_inducing: ``M`` (default ``ceil(sqrt(N))``).
            prior_points: Subset size of the prior fit.
            prior_steps: L-BFGS iterations per start of the prior fit
                (:func:`~gpext.models.gwi_exact_prior.fit_exact_prior`; its
                :class:`~gpext.fit.FitResult` is stored as ``model.prior_fit_result``).
            mean_module: Custom :math:`m_Q` returning ``(J, N)``.
            image_shape: ``(C, H, W)`` of flattened image inputs (selects the CNN mean).
            epsilon: Robust-max error probability (0.01 as in Wild et al. 2022).
            prior_outputscale: Variance the fitted prior kernel is rescaled to (its lengthscale
                is kept; the noise used to initialise ``L`` is rescaled alike).  Robust max is
                invariant to the scale of the latents, so the scale fitted on the one-hot labels
                (about 0.1) carries no information, while it sets the width
                :math:`\sqrt{r}` of the probit smoothing in the expected log-likelihood; with
                a narrow width the gradient vanishes for misclassified points whose margin
                exceeds a few tenths, and training a network mean stalls.  ``None`` keeps the
                fitted scale.
            num_subsample: ``N_S`` of the W2 estimator.
            learn_inducing_locations: Whether ``Z`` is trained (default off: ``Z`` stays a
                subset of the data as in 003, and with a fixed ``L`` even small moves of ``Z``
                break the cancellation between :math:`-k_{xZ}K_{ZZ}^{-1}k_{Zx'}` and
                :math:`k_{xZ}LL^\top k_{Zx'}` when :math:`K_{ZZ}` is ill-conditioned).
            inducing: How ``Z`` is picked from the data: ``"greedy"`` (default,
                :func:`~gpext.models.greedy_inducing_subset.greedy_inducing_subset` under the fitted prior
                kernel) or ``"random"``.
            generator: Random generator.
            show_progress: Progress bar of the prior fit.
            standardize: Standardise the inputs (default; :mod:`gpext.fit.standardize`):
                column by column, or with one location and scale over all pixels when
                ``image_shape`` is given; kept as ``model.standardizer``, and every method
                takes inputs in the original units.  ``False``: the inputs are used as given.

        Returns:
            ``(model, likelihood)`` with a :class:`gpext.likelihoods.RobustMaxLikelihood`.

        Raises:
            ShapeError: If ``x`` is not ``(N, D)`` or ``y`` not ``(N,)``.
            InputDataError: If ``inducing`` is not ``"greedy"`` or ``"random"``, the labels
                are out of range, or ``x`` or ``y`` has NaN or infinite entries.
            InputTypeError: If the labels are not whole numbers (e.g. strings).
        """
        from gpext.likelihoods.robust_max_likelihood import RobustMaxLikelihood

        j = check_positive_int(num_classes, "num_classes", minimum=2)
        # numpy / sequences too; the model adopts the data's dtype (float32 or float64)
        x = as_fit_input(x, f"{cls.__name__}.from_data(x)")
        if x.dim() == 2 and x.shape[0] == 0:
            raise InputDataError(
                expected_got(f"{cls.__name__}.from_data(x)", "at least one row", tuple(x.shape))
            )
        if not isinstance(y, torch.Tensor):  # strings and other non-numeric labels: an error
            y = check_labels(y, j, "GWIClassificationModel.from_data: y").to(x.device)
        if x.dim() != 2 or y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ShapeError(
                expected_got(
                    "GWIClassificationModel.from_data(x, y)",
                    "x (N, D), y (N,)",
                    f"{tuple(x.shape)}, {tuple(y.shape)}",
                )
            )
        check_finite(x, "GWIClassificationModel.from_data: x")
        _check_inducing_choice(inducing)
        check_finite(y, "GWIClassificationModel.from_data: y")
        y = check_labels(y, j, "GWIClassificationModel.from_data: y").to(x.device)
        n, d = x.shape
        # the data contract: the inputs are standardised (one location and scale over all
        # pixels for images), everything below lives on the standardised inputs
        standardizer = Standardizer(targets=False, name=f"{cls.__name__}.from_data")
        if standardize:
            standardizer.fit(x if image_shape is None else x.reshape(n, *image_shape))
            x = standardizer.transform_inputs(x)
        onehot = torch.nn.functional.one_hot(y, j).to(x) - 1.0 / j
        _, kernel, noise, prior_fit = fit_exact_prior(
            x, onehot, max_points=prior_points, steps=prior_steps, generator=generator,
            show_progress=show_progress, return_result=True,
        )  # fmt: skip
        if prior_outputscale is not None:
            # robust max only compares latents (argmax), so the prior's scale is free; the fit
            # on one-hot labels gives a variance of about 0.1, a probit width so narrow that
            # a misclassified point whose wrong margin exceeds a few tenths gets no gradient
            scale = float(prior_outputscale)
            if not scale > 0:
                raise InputDataError(
                    expected_got("prior_outputscale", "a positive float or None", repr(scale))
                )
            ratio = scale / float(kernel.outputscale)
            kernel.outputscale = scale
            noise = noise * ratio
        if mean_module is None:
            net = None
            if image_shape is not None:
                net = SmallCNN(j, image_shape=image_shape)
            mean_module = WassersteinNetworkMean(d, j, net=net)
        idx = _inducing_indices(x, kernel, num_inducing, inducing, generator)
        model = cls(
            x[idx].clone(), kernel, mean_module=mean_module, num_latents=j,
            num_subsample=num_subsample, learn_inducing_locations=learn_inducing_locations,
            generator=generator,
        ).to(x)  # fmt: skip
        sub = x[torch.randperm(n, generator=generator)[:prior_points].to(x.device)]
        model.variational_strategy.initialize_from_data(sub, noise * sub.shape[0] / n)
        model.prior_fit_result = prior_fit
        model.standardizer = standardizer.to(x.device)
        likelihood = RobustMaxLikelihood(j, epsilon=epsilon).to(x)
        return model, likelihood

    def _check_targets(self, y: torch.Tensor, name: str) -> torch.Tensor:
        """Labels: finite, whole numbers in ``[0, J)`` (returned as ``long``)."""
        check_finite(y, name)
        return check_labels(y, self.num_latents, name).to(y.device)

    def predict_proba(self, likelihood, x: torch.Tensor, *, batch_size: int = 1024) -> torch.Tensor:
        r"""Tempered robust-max class probabilities (003 section 2.2).

        Args:
            likelihood: The :class:`~gpext.likelihoods.RobustMaxLikelihood`.
            x: Test inputs. # shape: (N, D)
            batch_size: Points per forward pass.

        Returns:
            Probabilities :math:`\propto \mathbb Q(Y_*=j)^{1/T}`. # shape: (N, J)
        """
        x = as_model_input(
            x, self.variational_strategy.inducing_points, f"{type(self).__name__}.predict(x)"
        )
        self._check_fitted()
        check_rows(
            x, f"{type(self).__name__}.predict(x)",
            num_features=self.variational_strategy.inducing_points.shape[-1],
        )  # fmt: skip
        self.eval()
        out = []
        with torch.no_grad():
            for xb in x.split(batch_size):
                logp = likelihood.marginal(self(xb)).logits
                out.append(torch.softmax(logp / self.temperature, dim=-1))
        return torch.cat(out)

    def _predictive_cache(self, likelihood, x):
        return torch.cat([likelihood.marginal(self(xb)).logits for xb in x.split(1024)])

    def _tempered_nll(self, cache, y, temperature: float) -> float:
        logp = torch.log_softmax(cache / temperature, dim=-1)
        return float(-logp.gather(-1, y.long().reshape(-1, 1).to(logp.device)).mean())
