"""Variational bootstrap for random-Fourier-feature GP approximations (001 Sec. 4.2, Alg. 2)."""

from __future__ import annotations

import gpytorch
import torch

from gpext.bootstrap._targets import (
    check_classes,
    check_inputs,
    check_task,
    dirichlet_targets,
    particle_average_probs,
    particle_mixture,
    regression_targets,
)
from gpext.bootstrap.perturbed_map import solve_perturbed_map
from gpext.bootstrap.rbf_hyperparameters import RBFHyperparameters, fit_rbf_hyperparameters
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.fit import FitResult, StopReason
from gpext.likelihoods.dirichlet_transform import DirichletTransform
from gpext.utils import check_positive_int

__all__ = ["VBootRFF"]


class VBootRFF(torch.nn.Module):
    r"""Variational-bootstrap ensemble of an RFF approximation of an RBF-kernel GP.

    The latent functions are ``f_c(x) = m_c + phi(x)^T w_c`` with the sine/cosine random
    Fourier features of :class:`gpytorch.kernels.RFFKernel` (``num_features / 2`` frequencies,
    ``phi(x)^T phi(x') ~ k_RBF(x, x')``) and the prior ``w_c ~ N(0, alpha^2 I)`` with
    ``alpha^2`` the kernel's output scale.  Each of the ``K`` particles of each output is the
    closed-form perturbed MAP of 001 Eq. (8),

    .. math::
        \hat{\mathbf{w}} = \mathbf{A}^{-1}\Big(\boldsymbol{\Phi}^\top \mathbf{S}^{-1}
        (\mathbf{y} + \boldsymbol{\varepsilon}) + \frac{1}{\alpha^2}\tilde{\mathbf{w}}\Big),
        \qquad \boldsymbol{\varepsilon} \sim \mathcal{N}(0, \mathbf{S}),\
        \tilde{\mathbf{w}} \sim \mathcal{N}(0, \alpha^2 \mathbf{I}),

    computed with one Cholesky factorisation of ``A_c`` per output shared by its particles
    (see :func:`~gpext.bootstrap.solve_perturbed_map`).  With a Gaussian likelihood the
    particles are exact posterior draws (001 Eq. 9).

    * ``task="regression"``: ``y`` real, ``(N,)`` or ``(N, C)``; noise ``sigma^2`` given or
      fitted.  Predictions are the equally weighted Gaussian mixture over particles
      (:meth:`predict_mixture`).
    * ``task="classification"``: integer labels are turned into regression targets and
      per-point, per-class noise by the Dirichlet transform (001 Eq. 10-11, 13).  Class
      probabilities are the particle average of the softmax of the latent functions (001 Eq. 12,
      :meth:`predict_proba`).

    Hyperparameters (ARD lengthscales, output scale, per-output constant mean, regression noise)
    are taken from the arguments; the missing ones are fitted once, before bootstrapping, by
    :func:`~gpext.bootstrap.fit_rbf_hyperparameters` on ``hyper_num_points`` training points.

    Args:
        num_features: Number of random features ``D`` (even: ``D / 2`` frequencies).
        num_particles: Number of particles ``K`` per output.
        task: ``"regression"`` or ``"classification"``.
        num_classes: Number of classes ``C`` (required for classification).
        lengthscale: RBF lengthscale(s), scalar or ``(d,)``; fitted when ``None``.
        outputscale: Prior variance ``alpha^2``; fitted when ``None``.
        mean: Constant prior mean per output, scalar or ``(C,)``; fitted with the other
            hyperparameters, or the precision-weighted target mean when those are all given.
        noise: Regression noise variance (scalar, ``(N,)`` or ``(N, C)``); fitted when ``None``.
        alpha_epsilon: Dirichlet ``alpha_epsilon`` (classification), passed to
            :class:`gpext.likelihoods.dirichlet_transform.DirichletTransform`.
        hyper_num_points: Subset size for the hyperparameter fit; with ``C > 2`` outputs it
            shrinks by ``(2 / C)^(1/3)`` so that the fit costs about as much as for two.
        hyper_iters: L-BFGS iterations per start of the hyperparameter fit.
        hyper_restarts: Starts of the hyperparameter fit (``None``: 4 on subsets of at most
            500 points, else 2; see :func:`~gpext.bootstrap.fit_rbf_hyperparameters`).
        method: Solver of :func:`~gpext.bootstrap.solve_perturbed_map`.
        gram_memory: Bytes for cached group Gram matrices (see the solver).

    Example:
        >>> x = torch.randn(200, 2, dtype=torch.float64)
        >>> y = (x[:, 0] > 0).long()
        >>> model = VBootRFF(num_features=200, num_particles=10, task="classification", num_classes=2)
        >>> result = model.fit(x, y, generator=torch.Generator().manual_seed(0))
        >>> model.predict_proba(x[:5]).shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        num_features: int = 5000,
        num_particles: int = 50,
        *,
        task: str = "regression",
        num_classes: int | None = None,
        lengthscale: float | torch.Tensor | None = None,
        outputscale: float | None = None,
        mean: float | torch.Tensor | None = None,
        noise: float | torch.Tensor | None = None,
        alpha_epsilon: float = 0.01,
        hyper_num_points: int = 1000,
        hyper_iters: int = 100,
        hyper_restarts: int | None = None,
        method: str = "auto",
        gram_memory: int = 2**30,
    ) -> None:
        super().__init__()
        self.num_features = check_positive_int(num_features, "VBootRFF.num_features", minimum=2)
        if self.num_features % 2:
            raise InputDataError(
                expected_got(
                    "VBootRFF.num_features", "an even number (sine and cosine pairs)", num_features
                )
            )
        self.num_particles = check_positive_int(num_particles, "VBootRFF.num_particles")
        self.task = check_task(task, "VBootRFF")
        self.num_classes = check_classes(task, num_classes, "VBootRFF")
        self.alpha_epsilon = float(alpha_epsilon)
        self.hyper_num_points = hyper_num_points
        self.hyper_iters = hyper_iters
        self.hyper_restarts = hyper_restarts
        self.method = method
        self.gram_memory = gram_memory
        self._given = {
            "lengthscale": lengthscale,
            "outputscale": outputscale,
            "mean": mean,
            "noise": noise,
        }
        if task == "classification" and noise is not None:
            raise InputDataError(
                "VBootRFF: noise is set by the Dirichlet transform for classification; pass "
                "alpha_epsilon instead of noise."
            )
        if task == "classification":
            DirichletTransform(self.num_classes, alpha_epsilon)  # validates alpha_epsilon early
        self.kernel: gpytorch.kernels.RFFKernel | None = None
        self.hyperparameters: RBFHyperparameters | None = None

    # ------------------------------------------------------------------ state
    def _build(self, d: int, c: int, dtype: torch.dtype, device: torch.device) -> None:
        self.kernel = gpytorch.kernels.RFFKernel(self.num_features // 2, ard_num_dims=d).to(
            device=device, dtype=dtype
        )
        self.kernel.requires_grad_(False)  # hyperparameters are fixed once fitted
        self.kernel.register_buffer(
            "randn_weights", torch.zeros(d, self.num_features // 2, dtype=dtype, device=device)
        )
        self.register_buffer(
            "weights",
            torch.zeros(self.num_particles, c, self.num_features, dtype=dtype, device=device),
        )
        self.register_buffer("mean_", torch.zeros(c, dtype=dtype, device=device))
        self.register_buffer("outputscale_", torch.zeros((), dtype=dtype, device=device))
        self.register_buffer("noise_", torch.zeros((), dtype=dtype, device=device))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict, building the (lazily created) buffers from its shapes first."""
        if self.kernel is None and "weights" in state_dict:
            k, c, _ = state_dict["weights"].shape
            d = state_dict["kernel.randn_weights"].shape[0]
            ref = state_dict["weights"]
            self.num_particles = k
            self._build(d, c, ref.dtype, ref.device)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or a state-dict load) has run."""
        return self.kernel is not None

    def _check_fitted(self, what: str) -> None:
        if not self.is_fitted:
            raise NotFittedError(f"VBootRFF.{what}: the model is not fitted; call fit(x, y) first.")

    # ------------------------------------------------------------------ fitting
    def _resolve_hyperparameters(self, x, targets, noise, generator):
        given = self._given
        need_noise = self.task == "regression" and noise is None
        if given["lengthscale"] is None or given["outputscale"] is None or need_noise:
            # keep the fit's cost (C m^3) near that of two outputs with hyper_num_points points
            c = targets.shape[1]
            m = int(self.hyper_num_points * min(1.0, (2.0 / c) ** (1.0 / 3.0)))
            hp = fit_rbf_hyperparameters(
                x, targets, noise, num_points=max(m, 50), num_iters=self.hyper_iters,
                num_restarts=self.hyper_restarts, generator=generator,
            )  # fmt: skip
        else:
            w = noise.reciprocal()
            hp = RBFHyperparameters(
                lengthscale=torch.ones(x.shape[-1], dtype=x.dtype, device=x.device),
                outputscale=1.0,
                mean=(w * targets).sum(0) / w.sum(0),
            )
        if given["lengthscale"] is not None:
            hp.lengthscale = (
                torch.as_tensor(given["lengthscale"], dtype=x.dtype, device=x.device)
                .expand(x.shape[-1])
                .clone()
            )
        if given["outputscale"] is not None:
            hp.outputscale = float(given["outputscale"])
        if given["mean"] is not None:
            hp.mean = (
                torch.as_tensor(given["mean"], dtype=x.dtype, device=x.device)
                .expand(targets.shape[-1])
                .clone()
            )
        if bool((hp.lengthscale <= 0).any()) or not hp.outputscale > 0:
            raise InputDataError(
                expected_got(
                    "VBootRFF hyperparameters",
                    "positive lengthscale and outputscale",
                    f"{hp.lengthscale}, {hp.outputscale}",
                )
            )
        return hp

    def fit(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> FitResult:
        """Draw the frequencies, fit missing hyperparameters and solve for all particles.

        Args:
            x: Training inputs (float32 or float64; the model adopts their dtype).
                # shape: (N, d)
            y: Regression targets ``(N,)``/``(N, C)`` or class labels ``(N,)``.
            generator: Random generator (frequencies, hyperparameter subset, anchors,
                perturbations).
            show_progress: Progress bar over the outputs.

        Returns:
            The :class:`~gpext.fit.FitResult` of the hyperparameter fit (also in
            ``fit_result_``); when every hyperparameter is given, a result with no iterations
            (the particles themselves are closed-form solves).

        Raises:
            FitError: If the hyperparameter fit failed.
            ShapeError: If ``x`` and ``y`` disagree.
            InputDataError: On invalid values (NaNs, bad labels, non-positive noise).
            InputTypeError: On non-numeric inputs or non-integer labels.
        """
        x = check_inputs(x, "VBootRFF.fit")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputTypeError(
                expected_got(
                    "VBootRFF.fit generator", "a torch.Generator or None", type(generator).__name__
                )
            )
        n, d = x.shape
        if self.task == "classification":
            targets, noise = dirichlet_targets(
                y, self.num_classes, self.alpha_epsilon, n, "VBootRFF.fit", x.dtype, x.device
            )
        else:
            targets, noise = regression_targets(
                y, self._given["noise"], n, "VBootRFF.fit", x.dtype, x.device
            )
        hp = self._resolve_hyperparameters(x, targets, noise, generator)
        given_noise = self._given["noise"]
        if given_noise is not None and torch.as_tensor(given_noise).numel() == 1:
            hp.noise = float(torch.as_tensor(given_noise))
        if noise is None:
            noise = torch.full_like(targets, float(hp.noise))
        c = targets.shape[1]
        self._build(d, c, x.dtype, x.device)
        self.hyperparameters = hp
        freqs = torch.randn(d, self.num_features // 2, generator=generator, dtype=x.dtype).to(
            x.device
        )
        self.kernel.randn_weights.copy_(freqs)
        self.kernel.lengthscale = hp.lengthscale.reshape(1, d)
        self.mean_.copy_(hp.mean)
        self.outputscale_.fill_(hp.outputscale)
        self.noise_.fill_(float(hp.noise) if hp.noise is not None else float("nan"))
        with torch.no_grad():
            phi = self.features(x)
            self.weights.copy_(
                solve_perturbed_map(
                    phi,
                    targets - hp.mean,
                    noise,
                    hp.outputscale,
                    self.num_particles,
                    generator=generator,
                    method=self.method,
                    gram_memory=self.gram_memory,
                    show_progress=show_progress,
                )  # fmt: skip
            )
        result = hp.fit_result
        if result is None:
            result = FitResult(
                stop_reason=StopReason.CONVERGED,
                message="hyperparameters given; the particles are closed-form solves",
            )
        self.fit_result_ = result
        return result

    # ------------------------------------------------------------------ prediction
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Random Fourier features ``phi(x)`` (``phi(x)^T phi(x') ~ k_RBF(x, x')``).

        Args:
            x: Inputs.  # shape: (M, d)

        Returns:
            The features.  # shape: (M, D)
        """
        self._check_fitted("features")
        return self.kernel._featurize(x, normalize=True)

    def _check_test_inputs(self, x, what):
        self._check_fitted(what)
        x = check_inputs(x, f"VBootRFF.{what}", self.weights.dtype).to(self.weights.device)
        if x.shape[-1] != self.kernel.randn_weights.shape[0]:
            raise ShapeError(
                expected_got(
                    f"VBootRFF.{what} x",
                    f"{self.kernel.randn_weights.shape[0]} columns",
                    x.shape[-1],
                )
            )
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Latent functions of every particle, ``m_c + phi(x)^T w_c^{(k)}``.

        Args:
            x: Test inputs.  # shape: (M, d)

        Returns:
            Particle function values.  # shape: (K, M, C)
        """
        x = self._check_test_inputs(x, "forward")
        out = []
        for xb in x.split(4096):
            out.append(torch.einsum("md,kcd->kmc", self.features(xb), self.weights))
        return torch.cat(out, dim=1) + self.mean_

    @torch.no_grad()
    def predict_mixture(
        self, x: torch.Tensor, noise: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Regression predictive as an equal-weight Gaussian mixture over particles.

        Args:
            x: Test inputs.  # shape: (M, d)
            noise: Observation noise variance of the test points; default the fitted (or
                given scalar) noise.  Required when the training noise was given per point.

        Returns:
            Component means and variances (latent particle values; variance = noise), each
            ``(K, M)`` for one output or ``(K, M, C)`` for several.

        Raises:
            InputDataError: For a classification model.
        """
        return particle_mixture("VBootRFF", self.task, self(x), self.noise_, noise)

    @torch.no_grad()
    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities, the particle average of the softmax (001 Eq. 12).

        Args:
            x: Test inputs.  # shape: (M, d)

        Returns:
            Probabilities.  # shape: (M, C)

        Raises:
            InputDataError: For a regression model.
        """
        return particle_average_probs("VBootRFF", self.task, self(x))
