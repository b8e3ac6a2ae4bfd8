r"""BoTorch adapter of :class:`gpext.models.DirichletGPClassifier`."""

from __future__ import annotations

import contextlib
from typing import Any

import gpytorch
import torch
from botorch.utils.datasets import SupervisedDataset
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator

from gpext.errors import InputTypeError, NotFittedError, expected_got
from gpext.integrations.botorch._construct_inputs import dataset_tensors
from gpext.integrations.botorch._training_data import labels_from_targets
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.models import DirichletGPClassifier
from gpext.models import _dirichlet_gp_solvers as solvers

__all__ = ["DirichletClassifierSurrogate"]


class DirichletClassifierSurrogate(LatentGPSurrogate):
    r"""A :class:`~gpext.models.DirichletGPClassifier` as a BoTorch model with ``C`` latent outputs.

    Latent function ``c`` is a GP regression on the Dirichlet-transformed targets
    :math:`\tilde{\mathbf y}_c` with per-point noise :math:`\mathbf D_c = \operatorname{diag}(
    \sigma^2_{c\cdot} + s^2)` (001 Eqs. 10-11).  The adapter returns its *joint* posterior
    over the ``q`` query points (the classifier's own ``predict_latent`` gives marginals):

    .. math::

        \mathbf f_c(X) \mid \mathcal D \sim \mathcal N\big(\mu_c + K_{X\cdot}(K + \mathbf D_c)^{-1}
            (\tilde{\mathbf y}_c - \mu_c),\ K_{XX} - K_{X\cdot}(K + \mathbf D_c)^{-1}K_{\cdot X}\big)

    for the exact classifier, and Titsias' collapsed posterior
    :math:`K_{XX} - Q_{XX} + K_{XZ}(K_{ZZ} + K_{ZN}\mathbf D_c^{-1}K_{NZ})^{-1}K_{ZX}` (mean
    :math:`K_{XZ}(\cdot)^{-1}K_{ZN}\mathbf D_c^{-1}\tilde{\mathbf y}_c`) for the sparse one.
    :meth:`class_probabilities` gives :math:`\mathbb E[\mathrm{softmax}(\mathbf f)]` by the
    deterministic approximation of :class:`~gpext.likelihoods.DirichletTransform` (differentiable,
    so it can weight an acquisition function: see
    :class:`~gpext.integrations.botorch.FeasibilityWeightedAcquisition`).

    Args:
        model: The classifier (fitted, or fitted by
            :func:`~gpext.integrations.botorch.fit_gpext_surrogate`).
        train_X: Training inputs for ``fit_gpext_surrogate``. # shape: (n, d)
        train_Y: Class labels as whole numbers. # shape: (n, 1)
        input_transform: BoTorch ``InputTransform``.

    Raises:
        InputTypeError: If ``model`` is not a ``DirichletGPClassifier``.

    Example:
        >>> import torch
        >>> from gpext.integrations.botorch import (
        ...     DirichletClassifierSurrogate, fit_gpext_surrogate)
        >>> from gpext.models import DirichletGPClassifier
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> labels = (X.sum(-1, keepdim=True) > 1).double()  # two classes, 0 and 1
        >>> clf = DirichletClassifierSurrogate(DirichletGPClassifier(2), train_X=X, train_Y=labels)
        >>> clf = fit_gpext_surrogate(clf, max_iter=50)
        >>> clf.class_probabilities(torch.rand(4, 1, X.shape[-1], dtype=X.dtype)).shape
        torch.Size([4, 1, 2])
    """

    def __init__(
        self,
        model: DirichletGPClassifier,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
        input_transform: torch.nn.Module | None = None,
    ) -> None:
        if not isinstance(model, DirichletGPClassifier):
            raise InputTypeError(
                expected_got(
                    "DirichletClassifierSurrogate.model",
                    "a DirichletGPClassifier",
                    type(model).__name__,
                )
            )
        super().__init__(train_X=train_X, train_Y=train_Y, input_transform=input_transform)
        self.model = model
        self._num_outputs = model.num_classes

    @classmethod
    def construct_inputs(
        cls,
        training_data: SupervisedDataset,
        *,
        num_classes: int | None = None,
        **classifier_kwargs: Any,
    ) -> dict[str, Any]:
        """Constructor arguments for an unfitted classifier on a dataset of class labels.

        BoTorch's ``Model.construct_inputs`` contract; Ax's registered fit
        (:func:`~gpext.integrations.botorch.ax_support.fit_ax_surrogate`) covers this adapter
        too, but it is no surrogate of an Ax metric: its posterior has one latent function per
        class, not one value per outcome, so it is meant as the feasibility model of
        :class:`~gpext.integrations.botorch.FeasibilityWeightedAcquisition`.

        Args:
            training_data: A ``SupervisedDataset`` whose ``Y`` holds labels. # shape: (n, 1)
            num_classes: ``C`` (default: the largest label plus one, at least 2).
            **classifier_kwargs: Further arguments of ``DirichletGPClassifier``.

        Returns:
            ``{"model", "train_X", "train_Y"}``.

        Raises:
            InputTypeError: If ``training_data`` is not a ``SupervisedDataset``.
            ShapeError: If ``Y`` is not ``(n, 1)``.
            InputDataError: If the labels are not whole numbers in ``[0, C)``.
        """
        X, Y = dataset_tensors(training_data, "DirichletClassifierSurrogate.construct_inputs")
        if num_classes is None:
            num_classes = max(2, int(Y.max().item()) + 1) if bool(torch.isfinite(Y).all()) else 2
        labels_from_targets(Y, num_classes, "DirichletClassifierSurrogate.construct_inputs")
        model = DirichletGPClassifier(num_classes, **classifier_kwargs)
        return {"model": model, "train_X": X, "train_Y": Y}

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        labels = labels_from_targets(Y, self.model.num_classes, "DirichletClassifierSurrogate")
        self.model.fit(X, labels, **kwargs)

    def _training_set(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        train = self.model._train
        if train is None:
            raise NotFittedError("DirichletClassifierSurrogate: fit the classifier first.")
        x = train["x"].to(X)
        nv = self.model._noise_values(X.dtype)  # per-class targets minus means, and noises
        onehot = torch.nn.functional.one_hot(train["labels"], self.model.num_classes).T.to(X)
        resid = nv.r_neg.unsqueeze(-1) + (nv.r_pos - nv.r_neg).unsqueeze(-1) * onehot
        noise = nv.s_neg + (nv.s_pos - nv.s_neg) * onehot
        return x, resid, noise  # shapes: (N, D), (C, N), (C, N)

    def _train_factors(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        """Training-side factors of the latent posterior, cached in eval mode.

        They depend on the training set and the hyperparameters only, not on the query points,
        so in eval mode (where an acquisition optimiser calls :meth:`posterior` many times)
        they are computed once and reused while the training set, the parameters (tracked by
        their in-place version counters), the dtype and the device stay the same.  As in
        GPyTorch's prediction caches (``gpytorch.settings.detach_test_caches``, on by
        default), cached factors are detached: gradients reach the query points, not the
        hyperparameters.  In train mode, or with ``detach_test_caches`` off, they are
        recomputed on every call and gradients reach the hyperparameters.
        """
        use_cache = not self.training and gpytorch.settings.detach_test_caches.on()
        key = None
        if use_cache:
            params = tuple((q.data_ptr(), q._version) for q in self.model.parameters())
            key = (X.dtype, X.device, params)
            cached = getattr(self, "_factor_cache", None)
            # the training set is compared by identity (the cache holds a reference to it)
            if cached is not None and cached[0] is self.model._train and cached[1] == key:
                return cached[2]
        with torch.no_grad() if use_cache else contextlib.nullcontext():
            factors = self._compute_train_factors(X)
        if use_cache:
            self._factor_cache = (self.model._train, key, factors)
        return factors

    def _compute_train_factors(self, X: torch.Tensor) -> dict[str, torch.Tensor]:
        kernel = self.model.kernel
        z = self.model.inducing_points
        if z is None:
            x, resid, noise = self._training_set(X)
            k = kernel(x).to_dense() + torch.diag_embed(noise)  # shape: (C, N, N)
            chol = solvers._chol(k, "K + D_c")
            alpha = torch.cholesky_solve(resid.unsqueeze(-1), chol)  # shape: (C, N, 1)
            return {"x": x, "chol": chol, "alpha": alpha}
        # the same factors as the classifier's collapsed bound and predict_latent
        train, z = self.model._train, z.to(X)
        x = train["x"].to(X)
        nv = self.model._noise_values(X.dtype)
        chol_m, _, chol_b, b = solvers._sparse_factors(
            kernel(z).to_dense(), kernel(z, x).to_dense(), train["offsets"], nv, self.model.jitter
        )
        coef = torch.cholesky_solve(b.unsqueeze(-1), chol_b)  # shape: (C, M, 1)
        return {"z": z, "chol_m": chol_m, "chol_b": chol_b, "coef": coef}

    def _latent(self, X: torch.Tensor) -> MultivariateNormal:
        factors = self._train_factors(X)
        # the classifier keeps its training inputs standardised (its data contract)
        X = self.model.standardizer.transform_inputs(X)
        kernel = self.model.kernel
        k_ss = kernel(X).to_dense().unsqueeze(-3)  # shape: (*b, 1, q, q)
        mu = self.model.class_means.to(X).unsqueeze(-1)  # shape: (C, 1)
        if "chol" in factors:
            chol = factors["chol"]
            k_ns = kernel(factors["x"], X).to_dense().unsqueeze(-3)  # shape: (*b, 1, N, q)
            mean = (k_ns.transpose(-1, -2) @ factors["alpha"]).squeeze(-1) + mu
            w = torch.linalg.solve_triangular(chol, k_ns, upper=False)  # shape: (*b, C, N, q)
            cov = k_ss - w.transpose(-1, -2) @ w
        else:
            chol_m, chol_b = factors["chol_m"], factors["chol_b"]
            v_s = torch.linalg.solve_triangular(
                chol_m, kernel(factors["z"], X).to_dense(), upper=False
            )
            v_s = v_s.unsqueeze(-3)  # shape: (*b, 1, M, q)
            mean = (v_s.transpose(-1, -2) @ factors["coef"]).squeeze(-1) + mu
            t = torch.linalg.solve_triangular(chol_b, v_s, upper=False)  # shape: (*b, C, M, q)
            cov = k_ss - v_s.transpose(-1, -2) @ v_s + t.transpose(-1, -2) @ t
        cov = 0.5 * (cov + cov.transpose(-1, -2))
        return MultivariateNormal(mean, DenseLinearOperator(cov))

    def _class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        mvn = self._latent(X)
        mean, var = mvn.mean.transpose(-1, -2), mvn.variance.clamp_min(0.0).transpose(-1, -2)
        return self.model.transform.class_probs(mean, var, method="approx")
