"""VBootRFF: features, exact posterior predictive (RBF and Matern), Dirichlet, errors."""

import gpytorch
import pytest
import torch

from gpext.bootstrap import VBootRFF, fit_kernel_hyperparameters
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.kernels.random_fourier_features_kernel import RandomFourierFeaturesKernel
from gpext.likelihoods.dirichlet_transform import DirichletTransform


def _regression_data(dtype, n=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=gen, dtype=torch.float64).to(dtype) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    return x, y


def _classification_data(dtype, n=150, seed=0, classes=3):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]], dtype=torch.float64)[:classes]
    y = torch.arange(n) % classes
    x = centers[y] + 0.5 * torch.randn(n, 2, generator=gen, dtype=torch.float64)
    return x.to(dtype), y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
class TestVBootRFFRegression:
    seed = 3

    def test_features_match_gpytorch_rff_kernel(self, dtype):
        x, y = _regression_data(dtype)
        model = VBootRFF(
            4000, 2, lengthscale=0.7, outputscale=1.0, noise=0.01, mean=0.0, standardize=False
        )  # the feature map on the inputs as given
        model.fit(x, y, generator=torch.Generator().manual_seed(self.seed))
        phi = model.features(x[:10])
        assert phi.shape == (10, 4000) and phi.dtype == dtype
        assert isinstance(model.kernel, RandomFourierFeaturesKernel) and model.kernel.base == "rbf"
        # the kernel's covariance, and the frequencies the former RFFKernel-based model drew
        torch.testing.assert_close(
            phi @ phi.T, model.kernel(x[:10]).to_dense(), rtol=1e-4, atol=1e-4
        )
        freqs = torch.randn(
            1, 2000, generator=torch.Generator().manual_seed(self.seed), dtype=dtype
        )
        assert torch.equal(model.kernel.omega, freqs)
        rff = gpytorch.kernels.RFFKernel(2000, num_dims=1).to(dtype)
        rff.randn_weights.copy_(freqs)
        rff.lengthscale = 0.7
        torch.testing.assert_close(phi @ phi.T, rff(x[:10]).to_dense(), rtol=1e-5, atol=1e-5)
        # and close to the RBF kernel it approximates (2000 frequencies: error ~ 0.03)
        rbf = gpytorch.kernels.RBFKernel().to(dtype)
        rbf.lengthscale = 0.7
        err = (phi @ phi.T - rbf(x[:10]).to_dense()).abs().max()
        assert err < 0.1

    def test_particle_mixture_matches_exact_predictive(self, dtype):
        """Particles are exact posterior draws: their mean/variance match 001 Eq. (3)."""
        x, y = _regression_data(dtype)
        k, noise, alpha2 = 4000, 0.05, 1.3
        model = VBootRFF(100, k, lengthscale=0.8, outputscale=alpha2, noise=noise, mean=0.0)
        model.fit(x, y, generator=torch.Generator().manual_seed(self.seed))
        xt = torch.linspace(-2.5, 2.5, 9, dtype=dtype)[:, None]
        means, variances = model.predict_mixture(xt)
        assert means.shape == (k, 9) and torch.allclose(
            variances, torch.full_like(variances, noise)
        )
        phi, phit = model.features(x).double(), model.features(xt).double()
        a = phi.T @ phi / noise + torch.eye(100, dtype=torch.float64) / alpha2
        cov = torch.linalg.inv(a)
        mean = phit @ (cov @ phi.T @ y.double()) / noise
        var = ((phit @ cov) * phit).sum(-1)
        se = (var / k).sqrt()
        assert ((means.double().mean(0) - mean).abs() / se).max() < 4.5
        # sample variance: relative standard error sqrt(2 / K) ~ 0.022
        ratio = means.double().var(0) / var
        assert ((ratio - 1).abs() < 0.12).all()

    def test_fitted_hyperparameters_and_state_dict(self, dtype):
        x, y = _regression_data(dtype, n=120)
        model = VBootRFF(200, 8, hyper_iters=12, hyper_num_points=100)
        model.fit(x, y, generator=torch.Generator().manual_seed(1))
        hp = model.hyperparameters
        assert 0.003 < hp.noise < 0.04  # true noise 0.01
        clone = VBootRFF(200, 8)
        clone.load_state_dict(model.state_dict())
        xt = torch.randn(5, 1, dtype=dtype)
        torch.testing.assert_close(clone(xt), model(xt))
        torch.testing.assert_close(clone.predict_mixture(xt)[1], model.predict_mixture(xt)[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
class TestVBootRFFDirichlet:
    seed = 4

    def test_uses_dirichlet_transform_targets(self, dtype):
        """Large prior variance, many features: particle means fit the transformed targets."""
        x, y = _classification_data(dtype, n=30)
        transform = DirichletTransform(3, alpha_epsilon=0.05)
        targets, noise = transform(y, dtype=dtype)
        model = VBootRFF(
            60, 2000, task="classification", num_classes=3, alpha_epsilon=0.05,
            lengthscale=1.0, outputscale=2.0, mean=targets.mean(0),
        )  # fmt: skip
        model.fit(x, y, generator=torch.Generator().manual_seed(self.seed))
        # the particle average is the heteroscedastic posterior mean under (targets, noise)
        phi = model.features(x).double()
        f_mean = model(x).double().mean(0)  # shape: (N, C)
        for c in range(3):
            prec = 1.0 / noise[:, c].double()
            a = phi.T @ (prec[:, None] * phi) + torch.eye(60, dtype=torch.float64) / 2.0
            rhs = phi.T @ (prec * (targets[:, c].double() - targets[:, c].mean().double()))
            exact = phi @ torch.linalg.solve(a, rhs) + targets[:, c].mean().double()
            assert (f_mean[:, c] - exact).abs().max() < 0.15

    def test_classification_probabilities(self, dtype):
        x, y = _classification_data(dtype)
        model = VBootRFF(
            300, 30, task="classification", num_classes=3, hyper_iters=8, hyper_num_points=90
        )
        model.fit(x, y, generator=torch.Generator().manual_seed(self.seed))
        probs = model.predict_proba(x)
        assert probs.shape == (150, 3) and probs.dtype == dtype
        torch.testing.assert_close(probs.sum(-1), torch.ones(150, dtype=dtype))
        # Eq. 12: average of per-particle softmax
        torch.testing.assert_close(probs, torch.softmax(model(x), -1).mean(0))
        assert (probs.argmax(-1) == y).double().mean() > 0.9
        far = torch.tensor([[30.0, 30.0]], dtype=dtype)  # far from data: close to the prior
        assert model.predict_proba(far).max() < probs.max(-1).values.mean()


def _exact_posterior(base, x, y, xt, lengthscale, outputscale, noise):
    """Exact GP posterior mean and latent variance with GPyTorch's kernel (float64)."""
    nu = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[base]
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=nu)).double()
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale

    class ExactGP(gpytorch.models.ExactGP):
        def forward(self, z):
            mean = torch.zeros(z.shape[:-1], dtype=z.dtype)
            return gpytorch.distributions.MultivariateNormal(mean, kernel(z))

    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
        torch.full_like(y, noise, dtype=torch.float64)
    )
    model = ExactGP(x.double(), y.double(), likelihood).eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(False, False, False):
        post = model(xt.double())
    return post.mean, post.variance


@pytest.mark.parametrize(
    "base, dtype",
    [("matern12", torch.float64), ("matern32", torch.float64), ("matern52", torch.float64),
     ("matern52", torch.float32)],
)  # fmt: skip
def test_matern_particles_match_exact_matern_posterior(base, dtype):
    """Gaussian likelihood: the particle mixture matches the exact Matern GP posterior.

    Four fits with independent features (1000 frequencies) and particles (500 each) give 2000
    particles.  Particle sampling alone gives an RMS standardised mean error of
    1/sqrt(2000) ~ 0.022 and a mean relative variance error of ~0.025; the features roughly
    double both (worst of 8 seeds: 0.044 and 0.095).  RBF features with the same
    hyperparameters miss by 0.18-0.25 and 0.35-0.77, Matern frequencies too large by sqrt(2)
    by 0.02-0.12 and 0.24-0.41.
    """
    x, y = _regression_data(torch.float64, n=40)
    xt = torch.linspace(-2.5, 2.5, 11, dtype=torch.float64)[:, None]
    ell, alpha2, noise = 0.8, 1.3, 0.1
    draws = []
    for r in range(4):
        model = VBootRFF(2000, 500, kernel=base, lengthscale=ell, outputscale=alpha2,
                         noise=noise, mean=0.0)  # fmt: skip
        model.fit(x.to(dtype), y.to(dtype), generator=torch.Generator().manual_seed(10 + r))
        assert model.kernel.base == base and model.hyperparameters.kernel == base
        draws.append(model.predict_mixture(xt.to(dtype))[0].double())
    particles = torch.cat(draws)  # shape: (2000, 11)
    mean, var = _exact_posterior(base, x, y, xt, ell, alpha2, noise)
    z = (particles.mean(0) - mean) / var.sqrt()
    assert z.square().mean().sqrt() < 0.08
    assert (particles.var(0) / var - 1).abs().mean() < 0.15


def test_matern_hyperparameters_come_from_exact_matern_fit():
    """Missing hyperparameters are fitted by the shared exact-GP fit of the exact Matern kernel."""
    x, y = _regression_data(torch.float64, n=60)
    model = VBootRFF(100, 4, kernel="matern52", hyper_iters=8, hyper_num_points=60)
    model.fit(x, y, generator=torch.Generator().manual_seed(1))
    hp = model.hyperparameters
    assert hp.kernel == "matern52" and hp.fit_result is model.fit_result_
    common = dict(num_points=60, num_iters=8, generator=torch.Generator().manual_seed(1))
    # the model fits its hyperparameters on the standardised data (its data contract)
    st = model.standardizer
    x, y = st.transform_inputs(x), st.transform_targets(y[:, None])[:, 0]
    direct = fit_kernel_hyperparameters(x, y[:, None], kernel="matern52", **common)
    torch.testing.assert_close(hp.lengthscale, direct.lengthscale)
    assert hp.noise == pytest.approx(direct.noise)
    common["generator"] = torch.Generator().manual_seed(1)
    rbf = fit_kernel_hyperparameters(x, y[:, None], kernel="rbf", **common)
    assert rbf.kernel == "rbf" and rbf.noise != pytest.approx(direct.noise, rel=0.1)
    torch.testing.assert_close(model.kernel.lengthscale.reshape(-1), hp.lengthscale)


def test_kernel_instance_and_state_dict():
    """An instance gives the base, the number of features and (drawn) frequencies."""
    x, y = _regression_data(torch.float64, n=30)
    template = RandomFourierFeaturesKernel(
        50, "matern32", num_dims=1, generator=torch.Generator().manual_seed(2)
    )
    before = template.lengthscale.detach().clone()
    model = VBootRFF(num_particles=6, kernel=template, lengthscale=0.5, outputscale=1.0,
                     noise=0.01)  # fmt: skip
    assert model.num_features == 100 and model.kernel_name == "matern32"
    model.fit(x, y, generator=torch.Generator().manual_seed(3))
    assert model.kernel is not template and torch.equal(template.lengthscale, before)
    torch.testing.assert_close(model.kernel.omega, template.omega.double())
    clone = VBootRFF(100, 6, kernel="matern32")
    clone.load_state_dict(model.state_dict())
    xt = torch.randn(5, 1, dtype=torch.float64)
    torch.testing.assert_close(clone(xt), model(xt))
    # state dicts of the former RFFKernel-based model kept the frequencies in randn_weights
    old = {("kernel.randn_weights" if k == "kernel.omega" else k): v
           for k, v in model.state_dict().items()}  # fmt: skip
    clone = VBootRFF(100)
    clone.load_state_dict(old)
    torch.testing.assert_close(clone(xt), model(xt))
    # a lazy (undrawn) template: fit draws the frequencies
    lazy = VBootRFF(kernel=RandomFourierFeaturesKernel(10, "matern12"), lengthscale=0.5,
                    outputscale=1.0, noise=0.01)  # fmt: skip
    lazy.fit(x, y, generator=torch.Generator().manual_seed(3))
    assert lazy.kernel.omega.shape == (1, 10)
    with pytest.raises(ShapeError, match="1 columns"):
        model.fit(torch.cat([x, x], -1), y)


class TestVBootRFFErrors:
    def test_kernel_errors(self):
        with pytest.raises(InputDataError, match="'matern72'"):
            VBootRFF(10, kernel="matern72")
        with pytest.raises(InputTypeError, match="RBFKernel"):
            VBootRFF(10, kernel=gpytorch.kernels.RBFKernel())
        with pytest.raises(InputDataError, match="2 \\* kernel.num_samples = 10"):
            VBootRFF(12, kernel=RandomFourierFeaturesKernel(5))
        with pytest.raises(InputDataError, match="batch shape"):
            VBootRFF(kernel=RandomFourierFeaturesKernel(5, batch_shape=torch.Size([2])))
        with pytest.raises(InputDataError, match="active dimensions"):
            VBootRFF(kernel=RandomFourierFeaturesKernel(5, active_dims=[0]))

    def test_constructor_errors(self):
        with pytest.raises(InputDataError, match="even"):
            VBootRFF(11)
        with pytest.raises(InputDataError, match="task"):
            VBootRFF(10, task="ranking")
        with pytest.raises(InputDataError, match="num_classes"):
            VBootRFF(10, task="classification")
        with pytest.raises(InputDataError, match="noise is set by the Dirichlet"):
            VBootRFF(10, task="classification", num_classes=2, noise=0.1)
        with pytest.raises(InputDataError, match="alpha_epsilon"):
            VBootRFF(10, task="classification", num_classes=2, alpha_epsilon=0.0)

    def test_fit_and_predict_errors(self):
        x, y = _classification_data(torch.float64, n=30)
        model = VBootRFF(
            20, 2, task="classification", num_classes=3, lengthscale=1.0, outputscale=1.0
        )
        with pytest.raises(NotFittedError, match="fit"):
            model.predict_proba(x)
        with pytest.raises(InputTypeError, match="integer class labels"):
            model.fit(x, y.double() + 0.5)
        with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
            model.fit(x, y + 1)
        with pytest.raises(ShapeError, match=r"shape \(30,\)"):
            model.fit(x, y[:-1])
        bad = x.clone()
        bad[0, 0] = float("nan")
        with pytest.raises(InputDataError, match="NaN"):
            model.fit(bad, y)
        with pytest.raises(InputTypeError, match="torch.Generator"):
            model.fit(x, y, generator=0)
        with pytest.raises(InputDataError, match="float32 or torch.float64"):
            model.fit(x.half(), y)
        model.fit(x, y)
        with pytest.raises(ShapeError, match="columns"):
            model.predict_proba(torch.zeros(2, 5, dtype=torch.float64))
        with pytest.raises(InputDataError, match="classifier"):
            model.predict_mixture(x)
        reg = VBootRFF(20, 2, lengthscale=1.0, outputscale=1.0, noise=torch.full((30,), 0.1))
        reg.fit(x, x[:, 0])
        with pytest.raises(InputDataError, match="per point"):
            reg.predict_mixture(x)
        with pytest.raises(InputDataError, match="regressor"):
            reg.predict_proba(x)
        with pytest.raises(InputDataError, match="finite positive"):
            VBootRFF(20, 2, lengthscale=1.0, outputscale=1.0, noise=-1.0).fit(x, x[:, 0])


class TestHyperparameterFallback:
    """Failed trial points are rejected; only when every start fails does Adam take over."""

    @staticmethod
    def _hartmann6_sobol(seed, n):
        hartmann = pytest.importorskip("botorch.test_functions").Hartmann(dim=6)
        x = torch.quasirandom.SobolEngine(6, scramble=True, seed=seed).draw(n).double()
        return x, -hartmann(x)

    def test_lbfgs_rejects_failed_points_instead_of_falling_back(self, recwarn):
        from gpext.bootstrap import fit_rbf_hyperparameters

        # torch's L-BFGS line search reached NaN here and the old fit fell back to Adam
        x, y = self._hartmann6_sobol(seed=27, n=10)
        hp = fit_rbf_hyperparameters(x, y)
        assert not [w for w in recwarn if "falling back" in str(w.message)]
        assert torch.isfinite(hp.lengthscale).all() and hp.noise is not None and hp.noise > 0
        assert hp.fit_result.stop_reason.value in ("converged", "max_iterations")
        model = VBootRFF(num_features=64, num_particles=8)
        model.fit(x, y)
        means, variances = model.predict_mixture(x)
        assert torch.isfinite(means).all() and (variances > 0).all()

    def test_every_start_failing_falls_back_to_adam_with_warning(self, monkeypatch):
        import gpext.fit.exact_gp as exact_gp
        from gpext.bootstrap import fit_rbf_hyperparameters
        from gpext.errors import FitError, NumericalWarning

        def failing(*args, **kwargs):
            raise FitError("minimize_lbfgs: the loss cannot be evaluated at the initial point")

        monkeypatch.setattr(exact_gp, "minimize_lbfgs", failing)
        x, y = _regression_data(torch.float64)
        with pytest.warns(NumericalWarning, match="falling back"):
            hp = fit_rbf_hyperparameters(x, y)
        assert torch.isfinite(hp.lengthscale).all() and hp.noise > 0
        assert "NumericalWarning" in hp.fit_result.problems
        assert hp.fit_result.restarts[-1].message == "Adam fallback"

    def test_adam_is_not_used_when_lbfgs_succeeds(self, recwarn):
        from gpext.bootstrap import fit_rbf_hyperparameters

        x, y = _regression_data(torch.float64)
        fit_rbf_hyperparameters(x, y)
        assert not [w for w in recwarn if "falling back" in str(w.message)]


def test_fixed_noise_fit_is_maximum_marginal_likelihood_from_one_start():
    # Dirichlet targets: the noise is fixed, so no priors (scaled for regression targets)
    # and one start; the optimum is a stationary point of the plain marginal likelihood
    from gpext.bootstrap._targets import dirichlet_targets
    from gpext.fit import build_exact_gp
    from gpext.fit.exact_gp import _map_loss

    gen = torch.Generator().manual_seed(1)
    x = (torch.rand(60, 1, generator=gen, dtype=torch.float64) * 6 - 3).sort(0).values
    y = torch.bernoulli(torch.sigmoid(4 * torch.sin(1.5 * x[:, 0])), generator=gen).long()
    t, noise = dirichlet_targets(y, 2, 0.01, 60, "test", torch.float64, x.device)
    hp = fit_kernel_hyperparameters(x, t, noise)
    assert len(hp.fit_result.restarts) == 1
    explicit = fit_kernel_hyperparameters(x, t, noise, priors=False, num_restarts=1)
    assert torch.allclose(hp.lengthscale, explicit.lengthscale)
    # the data as fit_kernel_hyperparameters saw them (it fits on the data as given)
    model = build_exact_gp(x, t, noise=noise, priors=False, standardize=False)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = hp.lengthscale
        model.covar_module.outputscale = hp.outputscale
        model.mean_module.constant.copy_(hp.mean.reshape(model.mean_module.constant.shape))
    model.train()
    loss = _map_loss(model)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    assert max(float(g.abs().max()) for g in grads) < 1e-3
    # with the priors the fit ends at a much shorter lengthscale on this toy
    with_priors = fit_kernel_hyperparameters(x, t, noise, priors=True)
    assert float(with_priors.lengthscale) < 0.5 * float(hp.lengthscale)
