"""Observation noise on the ensemble posteriors and Thompson sampling by function draws (issue 17).

* ``posterior(X, observation_noise=True)`` of VBoot adds its fitted noise, of a heteroscedastic
  weight ensemble each member's predicted variance (times ``variance_scale``), against closed
  forms computed here from the wrapped models; the mean is unchanged; tensor noise; the
  ``Standardize`` scale; scalarisation; the sampler; consistency with the conditioning noise.
* Function draws: an ensemble draw is one member's function everywhere; ``MaxPosteriorSampling``
  and ``PathwiseThompsonSampling`` run on the adapters; the pathwise draws of the GP adapters
  have the posterior's mean and covariance (Monte Carlo).
"""

from __future__ import annotations

import copy

import pytest
import torch
from _botorch_fixtures import D, dirichlet, gwi, ign, vboot_rff, weight_ensemble
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.transforms.outcome import Log, Standardize
from botorch.optim import optimize_acqf
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.sampling.get_sampler import get_sampler
from botorch.sampling.index_sampler import IndexSampler
from botorch.sampling.pathwise import draw_matheron_paths
from botorch.sampling.pathwise.posterior_samplers import get_matheron_path_model
from botorch.utils.testing import BotorchTestCase

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.integrations.botorch import (
    FunctionDrawPath,
    NoisyEnsemblePosterior,
    NoisyEnsembleSampler,
    WeightEnsembleSurrogate,
)
from gpext.nn import MLP, HeteroscedasticMLP
from gpext.subspace import OutputLikelihood, SubspaceModel, predict_weight_samples

DTYPES = (torch.float32, torch.float64)


def points(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, D, generator=g, dtype=torch.float64).to(dtype)


def with_standardize(model, shift: float = 0.7, scale: float = 2.5):
    """A copy of a single-output adapter with a fitted ``Standardize(1)`` of known std."""
    new = copy.deepcopy(model)
    octf = Standardize(1)
    octf.train()
    dtype = next(model.model.parameters()).dtype
    octf(torch.tensor([[shift - scale], [shift + scale]], dtype=dtype))
    new.outcome_transform = octf.eval()
    return new, float(octf.means.squeeze()), float(octf.stdvs.squeeze())


def tolerance(dtype: torch.dtype) -> dict:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10}


class TestObservationNoise(BotorchTestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(0)

    def test_vboot_adds_its_fitted_noise(self):
        for dtype in DTYPES:
            base = vboot_rff(dtype)
            model, mu, sd = with_standardize(base)
            x = points(dtype, 6, 1)
            members = base.model(x)[..., 0].detach()  # (K, N) particles, transformed space
            sigma2 = float(base.model.noise_)
            with torch.no_grad():
                latent = model.posterior(x.unsqueeze(-2))
                noisy = model.posterior(x.unsqueeze(-2), observation_noise=True)
            with self.subTest(dtype=dtype):
                self.assertIsInstance(noisy, NoisyEnsemblePosterior)
                self.assertNotIsInstance(latent, NoisyEnsemblePosterior)
                expected_mean = members.mean(0) * sd + mu
                expected_var = (members.var(0) + sigma2) * sd**2
                self.assertAllClose(noisy.mean.reshape(-1), expected_mean, **tolerance(dtype))
                self.assertAllClose(noisy.mean, latent.mean, atol=0.0)
                self.assertAllClose(noisy.variance.reshape(-1), expected_var, **tolerance(dtype))
                self.assertAllClose(
                    noisy.variance - latent.variance,
                    torch.full_like(latent.variance, sigma2 * sd**2),
                    **tolerance(dtype),
                )

    def test_heteroscedastic_weight_ensemble_adds_each_members_variance(self):
        for dtype in DTYPES:
            base = weight_ensemble(dtype, "swag", "heteroscedastic")
            self.assertEqual(base.likelihood.kind, "heteroscedastic_gaussian")
            model, _, sd = with_standardize(base)
            model.variance_scale = 2.5
            x = points(dtype, 7, 2)
            pred = predict_weight_samples(base.model, base.sample_weights, x, base.likelihood)
            means, variances = pred["means"].detach(), pred["variances"].detach()  # (S, N)
            with torch.no_grad():
                latent = model.posterior(x.unsqueeze(0))
                noisy = model.posterior(x.unsqueeze(0), observation_noise=True)
            with self.subTest(dtype=dtype):
                self.assertGreater(float(variances.std(1).max()), 0.0)  # heteroscedastic
                expected = (means.var(0) + 2.5 * variances.mean(0)) * sd**2
                self.assertAllClose(noisy.variance.reshape(-1), expected, **tolerance(dtype))
                self.assertAllClose(noisy.mean, latent.mean, atol=0.0)
                # each member keeps its own noise: (1, S, N, 1)
                self.assertAllClose(
                    noisy.noise[0, :, :, 0], 2.5 * variances * sd**2, **tolerance(dtype)
                )
                # the conditioning noise is the same mean noise (transformed space)
                cond_noise = model._exposed_noise_variance(x)[..., 0]
                self.assertAllClose(cond_noise, 2.5 * variances.mean(0), **tolerance(dtype))

    def test_from_subspace_carries_the_variance_scale(self):
        torch.manual_seed(3)
        net = HeteroscedasticMLP(D, [6]).double()
        d = sum(p.numel() for p in net.parameters())
        center = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        lik = OutputLikelihood("heteroscedastic_gaussian")
        sub = SubspaceModel(net, center, 0.1 * torch.randn(2, d, dtype=torch.float64), lik)
        sub.variance_scale = 3.0
        thetas = torch.randn(5, 2, dtype=torch.float64)
        model = WeightEnsembleSurrogate.from_subspace(sub, thetas, input_dim=D)
        self.assertEqual(model.variance_scale, 3.0)
        x = points(torch.float64, 4, 3)
        pred = sub.predict(x, thetas)  # variances already times variance_scale
        with torch.no_grad():
            noisy = model.posterior(x.unsqueeze(-2), observation_noise=True)
        expected = pred["means"].var(0) + pred["variances"].mean(0)
        self.assertAllClose(noisy.variance.reshape(-1), expected, atol=1e-10)
        with pytest.raises(InputDataError, match="positive finite"):
            model.variance_scale = 0.0

    def test_homoscedastic_gaussian_likelihood_uses_its_noise_variance(self):
        torch.manual_seed(4)
        net = MLP(D, [5], 1).double()
        d = sum(p.numel() for p in net.parameters())
        weights = torch.randn(4, d, dtype=torch.float64)
        lik = OutputLikelihood("gaussian", noise_variance=0.3)
        model = WeightEnsembleSurrogate(net, weights, lik, input_dim=D)
        x = points(torch.float64, 3, 4).unsqueeze(-2)
        with torch.no_grad():
            diff = model.posterior(x, observation_noise=True).variance - model.posterior(x).variance
        self.assertAllClose(diff, torch.full_like(diff, 0.3), atol=1e-10)

    def test_tensor_noise_and_scalarisation(self):
        dtype = torch.float64
        model, _, sd = with_standardize(vboot_rff(dtype))
        X = points(dtype, 6, 5).reshape(2, 3, D)
        noise = torch.rand(2, 3, 1, dtype=dtype)
        with torch.no_grad():
            latent = model.posterior(X)
            given = model.posterior(X, observation_noise=noise)
            scal = model.posterior(
                X,
                observation_noise=True,
                posterior_transform=ScalarizedPosteriorTransform(torch.tensor([2.0]), 1.0),
            )
        self.assertAllClose(given.variance - latent.variance, noise * sd**2, atol=1e-10)
        self.assertAllClose(given.mean, latent.mean, atol=0.0)
        sigma2 = float(model.model.noise_) * sd**2
        self.assertAllClose(scal.mean, 2.0 * latent.mean + 1.0, atol=1e-10)
        self.assertAllClose(scal.variance, 4.0 * (latent.variance + sigma2), atol=1e-10)
        # broadcast batch of the noise; without it on a batched query
        one = model.posterior(X, observation_noise=noise[:1])
        self.assertAllClose(one.variance[0], given.variance[0], atol=1e-10)

    def test_conditioned_ensemble_adds_the_base_noise(self):
        dtype = torch.float64
        model = weight_ensemble(dtype, "swag")
        Xc, Xq = points(dtype, 2, 6), points(dtype, 3, 7)
        cond = model.condition_on_observations(Xc, torch.zeros(2, 1, dtype=dtype))
        with torch.no_grad():
            diff = cond.posterior(Xq, observation_noise=True).variance - cond.posterior(Xq).variance
        self.assertAllClose(diff, model._exposed_noise_variance(Xq), atol=1e-10)

    def test_samples_and_sampler(self):
        dtype = torch.float64
        model, _, _ = with_standardize(weight_ensemble(dtype, "swag"))
        X = points(dtype, 4, 8).reshape(2, 2, D)
        post = model.posterior(X, observation_noise=True)
        sampler = get_sampler(post, torch.Size([5]), seed=3)
        self.assertIsInstance(sampler, NoisyEnsembleSampler)
        s1, s2 = sampler(post), sampler(post)
        self.assertEqual(s1.shape, torch.Size([5, 2, 2, 1]))
        self.assertTrue(torch.equal(s1, s2))  # fixed base samples: deterministic acquisition
        idx, eps = sampler.base_samples, sampler.noise_base_samples
        for i in range(5):
            for b in range(2):
                s = int(idx[i, b])
                expected = post.values[b, s] + post.noise[b, s].sqrt() * eps[i, b]
                self.assertAllClose(s1[i, b], expected, atol=1e-10)
        with pytest.raises(InputDataError, match="IndexSampler"):
            IndexSampler(torch.Size([2]))(post)
        # Monte Carlo: the mixture's variance (1/S spread + mean noise)
        x1 = X[:1, :1]
        with torch.no_grad():
            p1 = model.posterior(x1, observation_noise=True)
            draws = p1.rsample(torch.Size([40000]))
        s = p1.ensemble_size
        exact = p1.values.var(-3, unbiased=False) + p1.noise.mean(-3)
        self.assertAllClose(draws.var(0), exact[0] if exact.dim() > 3 else exact, rtol=0.05)
        self.assertGreater(s, 1)
        self.assertAllClose(draws.mean(0), p1.mean, atol=4 * float(exact.max()) ** 0.5 / 200)
        # gradients reach X through members and noise
        Xg = X.clone().requires_grad_(True)
        model.posterior(Xg, observation_noise=True).rsample(torch.Size([3])).sum().backward()
        self.assertTrue(bool(torch.isfinite(Xg.grad).all()) and float(Xg.grad.abs().sum()) > 0)

    def test_fantasize_with_the_noisy_sampler(self):
        dtype = torch.float64
        model = vboot_rff(dtype)
        X = points(dtype, 2, 9)
        fantasy = model.fantasize(X, NoisyEnsembleSampler(torch.Size([3]), seed=0))
        self.assertEqual(fantasy.batch_shape, torch.Size([3]))
        self.assertEqual(fantasy.posterior(points(dtype, 4, 10)).mean.shape, (3, 4, 1))

    def test_errors(self):
        dtype = torch.float64
        model = vboot_rff(dtype)
        X = points(dtype, 3, 11).unsqueeze(0)
        with pytest.raises(ShapeError, match="noise variances of shape"):
            model.posterior(X, observation_noise=torch.ones(3, 2, dtype=dtype))
        with pytest.raises(InputDataError, match="non-negative"):
            model.posterior(X, observation_noise=-torch.ones(1, 3, 1, dtype=dtype))
        with pytest.raises(InputTypeError, match="bool or a tensor"):
            model.posterior(X, observation_noise="yes")
        with pytest.raises(InputDataError, match="no observation-noise model"):
            vboot_rff(dtype, classification=True).posterior(X, observation_noise=True)
        logged = copy.deepcopy(model)
        logged.outcome_transform = Log().eval()
        with pytest.raises(InputDataError, match="linear outcome transform"):
            logged.posterior(X, observation_noise=True)

        class Shift(ScalarizedPosteriorTransform):
            pass

        class NotLinear(torch.nn.Module):
            scalarize = True

            def evaluate(self, Y, X=None):
                return Y.exp()

        with pytest.raises(InputDataError, match="ScalarizedPosteriorTransform"):
            model.posterior(X, observation_noise=True, posterior_transform=NotLinear())
        self.assertIsInstance(
            model.posterior(X, posterior_transform=Shift(torch.tensor([1.0]))), EnsemblePosterior
        )
        values = torch.zeros(2, 3, 1, dtype=dtype)
        with pytest.raises(ShapeError, match="member dimension"):
            NoisyEnsemblePosterior(values, torch.zeros(4, 3, 1, dtype=dtype))
        with pytest.raises(InputDataError, match="non-negative"):
            NoisyEnsemblePosterior(values, -torch.ones(1, 3, 1, dtype=dtype))


class TestFunctionDraws(BotorchTestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(0)

    def test_each_ensemble_draw_is_one_member_function(self):
        for dtype in DTYPES:
            for name, model in {
                "vboot_rff": vboot_rff(dtype),
                "swag": weight_ensemble(dtype, "swag"),
                "pca_ess": weight_ensemble(dtype, "pca_ess"),
            }.items():
                cands = points(dtype, 30, 12)
                path = model.draw_functions(6, generator=torch.Generator().manual_seed(1))
                self.assertIsInstance(path, FunctionDrawPath)
                with torch.no_grad():
                    draws = path(cands)  # (6, 30)
                    members = model.posterior(cands).values[..., 0]  # (S, 30)
                with self.subTest(dtype=dtype, model=name):
                    self.assertEqual(draws.shape, torch.Size([6, 30]))
                    for i in range(6):
                        match = (members - draws[i]).abs().amax(-1) == 0
                        self.assertTrue(bool(match.any()))  # one member, at every candidate
                        self.assertTrue(bool(match[path.draws.indices[i]]))
                    # draw i at X[i]: the same member functions, point by point
                    per = path(cands[:6].unsqueeze(-2)).squeeze(-1)
                    self.assertAllClose(per, draws.diagonal()[:6], atol=0.0)

    def test_multi_output_and_conditioned_ensembles(self):
        dtype = torch.float64
        X = points(dtype, 5, 19)
        clf = vboot_rff(dtype, classification=True)  # two latent outputs
        path_model = get_matheron_path_model(clf, torch.Size([3]))
        idx = path_model._path.draws.indices
        with torch.no_grad():
            self.assertAllClose(path_model(X), clf.posterior(X).values[idx], atol=0.0)
        base = vboot_rff(dtype)
        fantasy = base.fantasize(points(dtype, 1, 20), IndexSampler(torch.Size([4]), seed=0))
        path = fantasy.draw_functions(2, generator=torch.Generator().manual_seed(0))
        self.assertEqual(path.draws.indices.shape, torch.Size([2, 4]))
        with torch.no_grad():
            draws = path(X)  # (2, 4, 5): draw i of fantasy model j
            values = fantasy.posterior(X).values[..., 0]  # (4, S, 5)
        self.assertEqual(draws.shape, torch.Size([2, 4, 5]))
        for i in range(2):
            for j in range(4):
                self.assertAllClose(draws[i, j], values[j, path.draws.indices[i, j]], atol=0.0)

    def test_max_posterior_sampling_returns_candidates(self):
        dtype = torch.float64
        cands = points(dtype, 40, 13)
        for name, model in {
            "swag": weight_ensemble(dtype, "swag"),
            "ign": ign(dtype),
            "gwi": gwi(dtype),
            "dirichlet": dirichlet(dtype),  # latent of class 1: no pathwise draws
        }.items():
            tf = None
            if model.num_outputs > 1:
                tf = ScalarizedPosteriorTransform(torch.tensor([0.0, 1.0], dtype=dtype))
            mps = MaxPosteriorSampling(model, posterior_transform=tf, replacement=True)
            picked = mps(cands, num_samples=3)
            rows = {tuple(r.tolist()) for r in cands}
            with self.subTest(model=name):
                self.assertEqual(picked.shape, torch.Size([3, D]))
                self.assertTrue(all(tuple(r.tolist()) in rows for r in picked))

    def test_pathwise_thompson_sampling_on_an_ensemble_maximises_one_member(self):
        dtype = torch.float64
        model = weight_ensemble(dtype, "swag")
        acqf = PathwiseThompsonSampling(model)
        X = points(dtype, 20, 14).unsqueeze(-2)  # (20, 1, d): q = 1
        with torch.no_grad():
            values = acqf(X)  # one draw, evaluated at every X
            members = model.posterior(X.squeeze(-2)).values[..., 0]  # (S, 20)
        match = (members - values).abs().amax(-1) < 1e-12
        self.assertTrue(bool(match.any()))
        bounds = torch.tensor([[0.0] * D, [1.0] * D], dtype=dtype)
        cand, _ = optimize_acqf(
            acqf, bounds, q=1, num_restarts=2, raw_samples=16, options={"maxiter": 20}
        )
        self.assertEqual(cand.shape, torch.Size([1, D]))

    def test_gp_pathwise_draws_have_the_posterior_covariance(self):
        dtype = torch.float64
        X = points(dtype, 5, 15)
        for name, model in {"ign": ign(dtype), "gwi": gwi(dtype)}.items():
            path = model.draw_functions(
                8000, num_features=4096, generator=torch.Generator().manual_seed(2)
            )
            with torch.no_grad():
                draws = path(X)  # (8000, 5)
                post = model.posterior(X)
                mean, cov = post.mean[:, 0], post.covariance_matrix
            scale = float(cov.diagonal().max())
            with self.subTest(model=name):
                self.assertEqual(draws.shape, torch.Size([8000, 5]))
                se = (cov.diagonal() / 8000).sqrt()
                self.assertTrue(bool(((draws.mean(0) - mean).abs() < 5 * se).all()))
                self.assertAllClose(torch.cov(draws.T), cov, atol=0.1 * scale, rtol=0.0)
            # BoTorch's entry points: draw_matheron_paths and PathwiseThompsonSampling
            paths = draw_matheron_paths(model, sample_shape=torch.Size([3]))
            self.assertEqual(paths(X).shape, torch.Size([3, 5]))
            acqf = PathwiseThompsonSampling(model)
            Xq = points(dtype, 8, 16).reshape(4, 2, D).requires_grad_(True)  # q = 2
            acqf(Xq).sum().backward()
            self.assertTrue(bool(torch.isfinite(Xq.grad).all()))

    def test_draws_with_an_outcome_transform_are_in_the_original_space(self):
        dtype = torch.float64
        model, mu, sd = with_standardize(ign(dtype))
        base = ign(dtype)
        X = points(dtype, 4, 17)
        g = torch.Generator
        with torch.no_grad():
            raw = base.draw_functions(3, generator=g().manual_seed(5))(X)
            scaled = model.draw_functions(3, generator=g().manual_seed(5))(X)
        self.assertAllClose(scaled, raw * sd + mu, atol=1e-10)

    def test_errors(self):
        dtype = torch.float64
        with pytest.raises(InputDataError, match="MaxPosteriorSampling"):
            dirichlet(dtype).draw_functions(2)
        with pytest.raises(InputDataError, match="MaxPosteriorSampling"):
            gwi(dtype, classification=True).draw_functions(2)
        cond = ign(dtype).condition_on_observations(
            points(dtype, 1, 18), torch.zeros(1, 1, dtype=dtype)
        )
        with pytest.raises(InputDataError, match="MaxPosteriorSampling"):
            cond.draw_functions(2)
        with pytest.raises(InputDataError, match=">= 1"):
            vboot_rff(dtype).draw_functions(0)
        with pytest.raises(InputTypeError, match="positive int"):
            vboot_rff(dtype).draw_functions("2")
        with pytest.raises(InputDataError, match="even"):
            ign(dtype).draw_functions(2, num_features=33)
        path = vboot_rff(dtype).draw_functions(2)
        with pytest.raises(InputTypeError, match="dtype"):
            path(torch.rand(3, D, dtype=torch.float32))
