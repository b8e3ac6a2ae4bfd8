"""Variational bootstrap for random-Fourier-feature GP approximations (001 Sec. 4.2, Alg. 2)."""

from __future__ import annotations

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
from gpext.bootstrap.rbf_hyperparameters import (
    KERNEL_NAMES,
    KernelHyperparameters,
    fit_kernel_hyperparameters,
)
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.fit import (
    FitResult,
    Standardizer,
    StopReason,
    check_heldout,
    holdout_split,
    reference_heldout_nll,
)
from gpext.kernels.random_fourier_features_kernel import RandomFourierFeaturesKernel
from gpext.likelihoods.dirichlet_transform import DirichletTransform
from gpext.utils import check_positive_int

__all__ = ["VBootRFF"]


#: Most training rows :meth:`VBootRFF.fit` uses for its held-out check (a random subset).
CHECK_MAX_POINTS = 5000


class VBootRFF(torch.nn.Module):
    r"""Variational-bootstrap ensemble of an RFF approximation of an RBF- or Matern-kernel GP.

    The latent functions are ``f_c(x) = m_c + phi(x)^T w_c`` with the sine/cosine random
    Fourier features of
    :class:`~gpext.kernels.random_fourier_features_kernel.RandomFourierFeaturesKernel`
    (``num_features / 2`` frequencies, ``phi(x)^T phi(x') ~ k(x, x')`` for the RBF kernel or a
    Matern kernel with nu = 1/2, 3/2, 5/2) and the prior ``w_c ~ N(0, alpha^2 I)`` with
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
    :func:`~gpext.bootstrap.fit_kernel_hyperparameters` on ``hyper_num_points`` training
    points, for the *exact* kernel that the features approximate (Matern features: exact
    Matern hyperparameters).

    Args:
        num_features: Number of random features ``D`` (even: ``D / 2`` frequencies); default
            5000, or ``2 * kernel.num_samples`` for a kernel instance.
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
            500 points, else 2; classification, whose Dirichlet noise is fixed, is fitted by
            maximum marginal likelihood from one start; see
            :func:`~gpext.bootstrap.fit_kernel_hyperparameters`).
        method: Solver of :func:`~gpext.bootstrap.solve_perturbed_map`.
        gram_memory: Bytes for cached group Gram matrices (see the solver).
        kernel: The kernel the features approximate: ``"rbf"`` (default), ``"matern12"``,
            ``"matern32"``, ``"matern52"``, or a
            :class:`~gpext.kernels.random_fourier_features_kernel.RandomFourierFeaturesKernel`
            whose ``base`` and ``num_samples`` are used, and its frequencies too when they are
            already drawn (otherwise, as for a name, each :meth:`fit` draws new ones).  The instance is not modified:
            its lengthscale, prior and ARD setting are ignored (the lengthscales are the
            ``lengthscale`` argument or fitted, one per input); it must have no batch shape
            and no active dimensions.
        standardize: The data contract of :class:`gpext.fit.Standardizer`: inputs (and
            regression targets) are standardised on the training data inside the model,
            predictions come back in the original units, and given hyperparameters
            (``lengthscale``, ``outputscale``, ``mean``, ``noise``) are read in the original
            units.  ``False``: the data are used as given.

    Raises:
        InputDataError: For invalid settings (odd ``num_features``, unknown task or kernel
            name, ``num_features`` disagreeing with a kernel instance, ...).
        InputTypeError: If ``kernel`` is neither a name nor a ``RandomFourierFeaturesKernel``.

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
        num_features: int | None = None,
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
        kernel: str | RandomFourierFeaturesKernel = "rbf",
        standardize: bool = True,
    ) -> None:
        super().__init__()
        self.standardizer = Standardizer(
            inputs=standardize, targets=standardize and task == "regression", name="VBootRFF"
        )
        self.kernel_name, self._template_omega, template_features = _resolve_kernel(kernel)
        if num_features is None:
            num_features = template_features if template_features is not None else 5000
        self.num_features = check_positive_int(num_features, "VBootRFF.num_features", minimum=2)
        if template_features is not None and self.num_features != template_features:
            raise InputDataError(
                expected_got(
                    "VBootRFF.num_features",
                    f"2 * kernel.num_samples = {template_features} for the kernel given",
                    num_features, "Leave num_features out to take it from the kernel.",
                )
            )  # fmt: skip
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
        self.kernel: RandomFourierFeaturesKernel | None = None
        self.hyperparameters: KernelHyperparameters | None = None

    # ------------------------------------------------------------------ state
    def _build(
        self,
        d: int,
        c: int,
        dtype: torch.dtype,
        device: torch.device,
        generator: torch.Generator | None,
        omega: torch.Tensor | None = None,
    ) -> None:
        """Create the kernel and the buffers; frequencies ``omega`` or drawn from ``generator``."""
        # the constructor's draw (from a fixed seed, in the default dtype) is replaced below by
        # one in the model's dtype, which reproduces the former RFFKernel-based draw
        # torch.randn(d, D / 2, generator=generator, dtype=x.dtype) of the RBF features exactly
        self.kernel = RandomFourierFeaturesKernel(
            self.num_features // 2, self.kernel_name, ard_num_dims=d,
            generator=torch.Generator().manual_seed(0),
        ).to(device=device, dtype=dtype)  # fmt: skip
        if omega is not None:
            self.kernel.omega.copy_(omega)
        else:
            self.kernel.resample(generator)
        self.kernel.requires_grad_(False)  # hyperparameters are fixed once fitted
        self.register_buffer(
            "weights",
            torch.zeros(self.num_particles, c, self.num_features, dtype=dtype, device=device),
        )
        self.register_buffer("mean_", torch.zeros(c, dtype=dtype, device=device))
        self.register_buffer("outputscale_", torch.zeros((), dtype=dtype, device=device))
        # the regression noise in the original units: one per output when the outputs were
        # standardised with different scales
        self.register_buffer("noise_", torch.zeros((c,) if c > 1 else (), dtype=dtype,
                                                   device=device))  # fmt: skip

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict, building the (lazily created) buffers from its shapes first.

        State dicts saved before the kernel became a ``RandomFourierFeaturesKernel`` (with the
        frequencies in ``kernel.randn_weights``) load too.
        """
        if "kernel.randn_weights" in state_dict and "kernel.omega" not in state_dict:
            state_dict = {
                ("kernel.omega" if key == "kernel.randn_weights" else key): value
                for key, value in state_dict.items()
            }
        if self.kernel is None and "weights" in state_dict:
            k, c, _ = state_dict["weights"].shape
            d = state_dict["kernel.omega"].shape[0]
            ref = state_dict["weights"]
            self.num_particles = k
            # the frequencies are loaded with the rest of the state
            self._build(d, c, ref.dtype, ref.device, torch.Generator().manual_seed(0))
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or a state-dict load) has run."""
        return self.kernel is not None

    def _check_fitted(self, what: str) -> None:
        if not self.is_fitted:
            raise NotFittedError(f"VBootRFF.{what}: the model is not fitted; call fit(x, y) first.")

    def _y_scale(self, like: torch.Tensor) -> torch.Tensor:
        """The targets' scales ``(C,)`` (ones without target standardisation)."""
        st = self.standardizer
        if st.targets and st.y_scale.numel():
            return st.y_scale.to(like)
        return torch.ones(like.shape[-1], dtype=like.dtype, device=like.device)

    # ------------------------------------------------------------------ fitting
    def _resolve_hyperparameters(self, x, targets, noise, generator):
        given = self._given
        ls = given["lengthscale"]
        if ls is not None and torch.as_tensor(ls).numel() not in (1, x.shape[-1]):
            raise ShapeError(
                expected_got(
                    "VBootRFF(lengthscale)",
                    f"a scalar or one lengthscale per input ({x.shape[-1]}) for these data",
                    f"{torch.as_tensor(ls).numel()} values",
                    "Pass lengthscale of shape (d,) matching the columns of x, or None to fit.",
                )
            )
        need_noise = self.task == "regression" and noise is None
        if given["lengthscale"] is None or given["outputscale"] is None or need_noise:
            # keep the fit's cost (C m^3) near that of two outputs with hyper_num_points points
            c = targets.shape[1]
            m = int(self.hyper_num_points * min(1.0, (2.0 / c) ** (1.0 / 3.0)))
            hp = fit_kernel_hyperparameters(
                x, targets, noise, kernel=self.kernel_name, num_points=max(m, 50),
                num_iters=self.hyper_iters, num_restarts=self.hyper_restarts,
                generator=generator,
            )  # fmt: skip
        else:
            w = noise.reciprocal()
            hp = KernelHyperparameters(
                lengthscale=torch.ones(x.shape[-1], dtype=x.dtype, device=x.device),
                outputscale=1.0,
                mean=(w * targets).sum(0) / w.sum(0),
                kernel=self.kernel_name,
            )
        st = self.standardizer
        if given["lengthscale"] is not None:
            hp.lengthscale = (
                torch.as_tensor(given["lengthscale"], dtype=x.dtype, device=x.device)
                .expand(x.shape[-1])
                .clone()
            )
            if st.inputs and st.x_scale.numel():  # original units -> standardised inputs
                hp.lengthscale = hp.lengthscale / st.x_scale.to(x).expand(x.shape[-1])
        if given["outputscale"] is not None:
            hp.outputscale = float(given["outputscale"]) / float(
                self._y_scale(targets).pow(2).mean()
            )
        if given["mean"] is not None:
            hp.mean = (
                torch.as_tensor(given["mean"], dtype=x.dtype, device=x.device)
                .expand(targets.shape[-1])
                .clone()
            )
            if st.targets and st.y_loc.numel():
                hp.mean = st.transform_targets(hp.mean.unsqueeze(0)).reshape(-1)
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
        st = self.standardizer
        if self.task == "classification":
            st.fit(x)
            targets, noise = dirichlet_targets(
                y, self.num_classes, self.alpha_epsilon, n, "VBootRFF.fit", x.dtype, x.device
            )
        else:
            targets, noise = regression_targets(
                y, self._given["noise"], n, "VBootRFF.fit", x.dtype, x.device
            )
            st.fit(x, targets)
            targets = st.transform_targets(targets)
            if noise is not None:
                noise = noise / self._y_scale(targets).pow(2)
        x_original, x = x, st.transform_inputs(x)
        hp = self._resolve_hyperparameters(x, targets, noise, generator)
        given_noise = self._given["noise"]
        if given_noise is not None and torch.as_tensor(given_noise).numel() == 1:
            hp.noise = float(torch.as_tensor(given_noise)) / float(
                self._y_scale(targets).pow(2).mean()
            )
        if noise is None:
            noise = torch.full_like(targets, float(hp.noise))
        c = targets.shape[1]
        template = self._template_omega
        if template is not None and template.shape[0] != d:
            raise ShapeError(
                expected_got(
                    "VBootRFF.fit x", f"{template.shape[0]} columns (the input dimension of the "
                    "given kernel's frequencies)", f"{d} columns",
                )
            )  # fmt: skip
        self._build(d, c, x.dtype, x.device, generator, omega=template)
        self.hyperparameters = hp
        self.kernel.lengthscale = hp.lengthscale.reshape(1, d)
        self.mean_.copy_(hp.mean)
        self.outputscale_.fill_(hp.outputscale)
        if hp.noise is not None:
            self.noise_.copy_((float(hp.noise) * self._y_scale(targets).pow(2)).reshape(
                self.noise_.shape))  # fmt: skip
        else:
            self.noise_.fill_(float("nan"))
        del x_original
        with torch.no_grad():
            self.weights.copy_(
                solve_perturbed_map(
                    self.kernel.featurize(x),
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
        if self.task == "regression" and c == 1 and bool(torch.isfinite(noise).all()):
            self._check_heldout(x, targets, noise, hp, generator, result)
        self.fit_result_ = result
        return result

    @torch.no_grad()
    def _check_heldout(self, z, targets, noise, hp, generator, result) -> None:
        """The shared held-out check (:func:`gpext.fit.check_heldout`) of the particle mixture.

        The particles of a copy with the same frequencies and hyperparameters are solved on
        80% of (up to :data:`CHECK_MAX_POINTS`) training rows and their equal mixture,
        moment-matched, is scored on the other 20% (standardised units).
        """
        n = z.shape[0]
        rows = torch.randperm(n, generator=generator)[: min(n, CHECK_MAX_POINTS)].to(z.device)
        split = holdout_split(rows.numel(), 0.2, generator)
        if split is None:
            return
        tr, te = rows[split[0].to(z.device)], rows[split[1].to(z.device)]
        phi = self.kernel.featurize(z)
        w = solve_perturbed_map(
            phi[tr], targets[tr] - hp.mean, noise[tr], hp.outputscale,
            min(self.num_particles, 32), generator=generator, method=self.method,
            gram_memory=self.gram_memory, show_progress=False,
        )  # fmt: skip
        f = torch.einsum("md,kcd->kmc", phi[te], w)[..., 0] + hp.mean[0]  # shape: (K, M)
        var = f.var(0, unbiased=False) + noise[te, 0]
        reference = reference_heldout_nll(z[tr], targets[tr, 0], z[te], targets[te, 0],
                                          generator=torch.Generator().manual_seed(0))  # fmt: skip
        check_heldout(
            f.mean(0), var, targets[te, 0], train_mean=targets[tr, 0].mean(), name="VBootRFF",
            result=result, what="rows held out from a solve on the rest", stacklevel=3,
            reference_nll=reference,
        )  # fmt: skip

    # ------------------------------------------------------------------ prediction
    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Random Fourier features ``phi(x)`` (``phi(x)^T phi(x') ~ k(x, x')``, no output scale).

        Args:
            x: Inputs.  # shape: (M, d)

        Returns:
            The features.  # shape: (M, D)
        """
        x = self._check_test_inputs(x, "features")
        return self.kernel.featurize(self.standardizer.transform_inputs(x))

    def _check_test_inputs(self, x, what):
        self._check_fitted(what)
        x = check_inputs(x, f"VBootRFF.{what}", like=self.weights)
        if x.shape[-1] != self.kernel.num_dims:
            raise ShapeError(
                expected_got(f"VBootRFF.{what} x", f"{self.kernel.num_dims} columns", x.shape[-1])
            )
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r"""Latent functions of every particle, ``m_c + phi(x)^T w_c^{(k)}``.

        With target standardisation (the default) the values are returned in the original
        units, :math:`\mu_y + s_y (m_c + \phi(z)^\top w_c^{(k)})` with :math:`z` the
        standardised inputs.

        Args:
            x: Test inputs.  # shape: (M, d)

        Returns:
            Particle function values.  # shape: (K, M, C)
        """
        x = self._check_test_inputs(x, "forward")
        out = []
        for xb in x.split(4096):
            out.append(torch.einsum("md,kcd->kmc", self.features(xb), self.weights))
        f = torch.cat(out, dim=1) + self.mean_
        return self.standardizer.untransform_targets(f) if self.task == "regression" else f

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


def _resolve_kernel(kernel: object) -> tuple[str, torch.Tensor | None, int | None]:
    """Kernel name, template frequencies (``(d, S)`` or ``None``) and feature count of a kernel."""
    if isinstance(kernel, str):
        if kernel not in KERNEL_NAMES:
            raise InputDataError(
                expected_got(
                    "VBootRFF.kernel", f"one of {KERNEL_NAMES} or a RandomFourierFeaturesKernel",
                    repr(kernel), "Matern kernels are 'matern12', 'matern32' and 'matern52'.",
                )
            )  # fmt: skip
        return kernel, None, None
    if not isinstance(kernel, RandomFourierFeaturesKernel):
        raise InputTypeError(
            expected_got(
                "VBootRFF.kernel", "a kernel name or a RandomFourierFeaturesKernel",
                type(kernel).__name__,
                "Exact GPyTorch kernels are given by name ('rbf', 'matern32', ...).",
            )
        )  # fmt: skip
    if len(kernel.batch_shape) or kernel.active_dims is not None:
        raise InputDataError(
            expected_got(
                "VBootRFF.kernel", "a RandomFourierFeaturesKernel without batch shape or "
                "active dimensions", f"batch shape {tuple(kernel.batch_shape)}, active_dims "
                f"{kernel.active_dims}", "Select input columns before calling fit.",
            )
        )  # fmt: skip
    omega = None if kernel.num_dims is None else kernel.omega.detach().clone()
    return kernel.base, omega, 2 * kernel.num_samples
