"""``condition_on_observations`` / ``fantasize`` on every adapter (issue 17, Build item 2).

* GP adapters: the conditioned posterior equals the Gaussian update of the base posterior's joint
  distribution, computed here independently in numpy (with and without an outcome transform);
  sequential conditioning equals joint conditioning; a (nearly) noise-free observation collapses
  the variance at its point.
* Ensemble adapters: the updated ensemble's mean and covariance equal the Gaussian update of the
  base ensemble's own moments (the documented square-root update).
* Shapes: ``num_fantasies x batch x q x m``, fantasies of fantasies, ``n' = 0``.
* ``qKnowledgeGradient`` and ``qNegIntegratedPosteriorVariance`` run under ``optimize_acqf``.
"""

from __future__ import annotations

import copy

import gpytorch
import numpy as np
import torch
from _botorch_fixtures import D, dirichlet, gwi, ign, objective, vboot_rff, weight_ensemble
from botorch.acquisition import qKnowledgeGradient
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling.index_sampler import IndexSampler
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.testing import BotorchTestCase

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.integrations.botorch import ConditionedEnsembleSurrogate, ConditionedLatentGPSurrogate

DTYPES = (torch.float32, torch.float64)


def gp_adapters(dtype: torch.dtype) -> dict:
    return {
        "ign": ign(dtype),
        "gwi": gwi(dtype),
        "dirichlet": dirichlet(dtype),
        "dirichlet_sparse": dirichlet(dtype, sparse=True),
        "gwi_robust_max": gwi(dtype, classification=True),
    }


def ensemble_adapters(dtype: torch.dtype) -> dict:
    return {"vboot_rff": vboot_rff(dtype), "swag": weight_ensemble(dtype, "swag")}


def with_standardize(model, shift: float = 0.7, scale: float = 2.5):
    """A copy of a single-output adapter with a fitted ``Standardize(1)`` (mean, std known)."""
    new = copy.deepcopy(model)
    octf = Standardize(1)
    octf.train()
    dtype = next(model.model.parameters()).dtype
    y = torch.tensor([[shift - scale], [shift + scale]], dtype=dtype)
    octf(y)
    new.outcome_transform = octf.eval()
    return new, float(octf.means.squeeze()), float(octf.stdvs.squeeze())


def points(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, D, generator=g, dtype=torch.float64).to(dtype)


def gaussian_update(mean, cov, y, noise, n):
    """Closed-form conditioning of the joint N(mean, cov) on its first ``n`` coordinates."""
    mean, cov = np.asarray(mean, np.float64), np.asarray(cov, np.float64)
    k_cc = cov[:n, :n] + np.diag(np.broadcast_to(noise, (n,)))
    k_qc, k_qq = cov[n:, :n], cov[n:, n:]
    gain = np.linalg.solve(k_cc, k_qc.T).T
    return mean[n:] + gain @ (np.asarray(y, np.float64) - mean[:n]), k_qq - gain @ k_qc.T


def joint(model, X: torch.Tensor, j: int):
    """Mean and covariance of output ``j`` of a GP adapter's posterior at ``X`` (numpy)."""
    with torch.no_grad():
        post = model.posterior(X, output_indices=[j])
        return post.mean.squeeze(-1).double().numpy(), post.covariance_matrix.double().numpy()


class TestGPConditioningIsTheGaussianUpdate(BotorchTestCase):
    def test_matches_closed_form_every_output(self):
        for dtype in DTYPES:
            tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float32 else {"atol": 1e-8}
            Xc, Xq = points(dtype, 3, 1), points(dtype, 4, 2)
            for name, model in gp_adapters(dtype).items():
                m = model.num_outputs
                Y = torch.randn(3, m, generator=torch.Generator().manual_seed(3)).to(dtype)
                noise = torch.full((3, m), 0.05, dtype=dtype)
                cond = model.condition_on_observations(Xc, Y, noise=noise)
                self.assertIsInstance(cond, ConditionedLatentGPSurrogate)
                self.assertEqual(cond.batch_shape, torch.Size([]))
                for j in range(m):
                    mean, cov = joint(model, torch.cat([Xc, Xq]), j)
                    ref_mean, ref_cov = gaussian_update(mean, cov, Y[:, j].numpy(), 0.05, 3)
                    got_mean, got_cov = joint(cond, Xq, j)
                    with self.subTest(dtype=dtype, model=name, output=j):
                        np.testing.assert_allclose(got_mean, ref_mean, **tol)
                        np.testing.assert_allclose(got_cov, ref_cov, **tol)

    def test_outcome_transform_original_space_observations(self):
        """Y in the original space, noise in the transformed one (BoTorch's convention)."""
        dtype = torch.float64
        Xc, Xq = points(dtype, 3, 4), points(dtype, 5, 5)
        Y = objective(Xc) * 3.0 + 1.0
        for name in ("ign", "gwi"):
            model, _, std = with_standardize(gp_adapters(dtype)[name])
            cond = model.condition_on_observations(Xc, Y, noise=torch.full_like(Y, 0.1))
            mean, cov = joint(model, torch.cat([Xc, Xq]), 0)
            ref_mean, ref_cov = gaussian_update(mean, cov, Y[:, 0].numpy(), 0.1 * std**2, 3)
            got_mean, got_cov = joint(cond, Xq, 0)
            with self.subTest(model=name):
                np.testing.assert_allclose(got_mean, ref_mean, atol=1e-8)
                np.testing.assert_allclose(got_cov, ref_cov, atol=1e-8)

    def test_default_noise_is_the_model_noise(self):
        dtype = torch.float64
        Xc, Xq = points(dtype, 2, 6), points(dtype, 3, 7)
        Y = objective(Xc)
        for name in ("ign", "gwi"):
            model = gp_adapters(dtype)[name]
            with torch.no_grad():
                latent = model.posterior(Xc).variance
                noisy = model.posterior(Xc, observation_noise=True).variance
            sigma2 = float((noisy - latent).mean())
            cond = model.condition_on_observations(Xc, Y)
            explicit = model.condition_on_observations(Xc, Y, noise=torch.full_like(Y, sigma2))
            with self.subTest(model=name):
                self.assertGreater(sigma2, 0.0)
                self.assertAllClose(cond.posterior(Xq).mean, explicit.posterior(Xq).mean)
                self.assertAllClose(cond.posterior(Xq).variance, explicit.posterior(Xq).variance)

    def test_sequential_equals_joint_conditioning(self):
        dtype = torch.float64
        X1, X2, Xq = points(dtype, 2, 8), points(dtype, 3, 9), points(dtype, 4, 10)
        for name, model in gp_adapters(dtype).items():
            m = model.num_outputs
            Y1, Y2 = torch.randn(2, m, dtype=dtype), torch.randn(3, m, dtype=dtype)
            seq = model.condition_on_observations(X1, Y1).condition_on_observations(X2, Y2)
            both = model.condition_on_observations(torch.cat([X1, X2]), torch.cat([Y1, Y2]))
            self.assertIs(seq.base_model, model)
            p_seq, p_both = seq.posterior(Xq), both.posterior(Xq)
            with self.subTest(model=name):
                self.assertAllClose(p_seq.mean, p_both.mean, atol=1e-9)
                self.assertAllClose(p_seq.covariance_matrix, p_both.covariance_matrix, atol=1e-9)

    def test_noise_free_observation_collapses_the_variance(self):
        for dtype in DTYPES:
            x0 = points(dtype, 1, 11)
            for name, model in gp_adapters(dtype).items():
                m = model.num_outputs
                y0 = torch.full((1, m), 0.3, dtype=dtype)
                prior = model.posterior(x0).variance
                cond = model.condition_on_observations(x0, y0, noise=torch.zeros_like(y0))
                post = cond.posterior(x0)
                with self.subTest(dtype=dtype, model=name):
                    # up to GPyTorch's variance floor (1e-6 in float32): a model whose
                    # calibrated prior variance is small here collapses to the floor
                    floor = gpytorch.settings.min_variance.value(dtype)
                    self.assertTrue(bool((post.variance <= 1e-4 * prior + floor).all()))
                    self.assertAllClose(post.mean, y0.expand_as(post.mean), atol=1e-3)

    def test_observation_noise_and_subset_output_on_the_conditioned_model(self):
        dtype = torch.float64
        Xc, Xq = points(dtype, 2, 12), points(dtype, 3, 13)
        model = ign(dtype)
        cond = model.condition_on_observations(Xc, objective(Xc))
        latent, noisy = cond.posterior(Xq).variance, cond.posterior(Xq, observation_noise=True)
        noise = model.posterior(Xq, observation_noise=True).variance - model.posterior(Xq).variance
        self.assertAllClose(noisy.variance - latent, noise)
        clf = dirichlet(dtype)
        cond = clf.condition_on_observations(Xc, torch.randn(2, 2, dtype=dtype))
        sub = cond.subset_output([1])
        self.assertEqual(sub.num_outputs, 1)
        self.assertAllClose(sub.posterior(Xq).mean, cond.posterior(Xq, output_indices=[1]).mean)
        with self.assertRaises(InputDataError):
            sub.condition_on_observations(Xc, torch.randn(2, 1, dtype=dtype))
        with self.assertRaises(InputDataError):
            cond.class_probabilities(Xq.unsqueeze(-2))


class TestFantasizeShapes(BotorchTestCase):
    def test_gp_and_ensemble_adapters(self):
        for dtype in DTYPES:
            models = {**gp_adapters(dtype), **ensemble_adapters(dtype)}
            X = torch.rand(3, 2, D, dtype=dtype)
            for name, model in models.items():
                m = model.num_outputs
                fm = model.fantasize(X, SobolQMCNormalSampler(torch.Size([4])))
                with self.subTest(dtype=dtype, model=name):
                    self.assertEqual(fm.batch_shape, torch.Size([4, 3]))
                    post = fm.posterior(torch.rand(3, 5, D, dtype=dtype))
                    self.assertEqual(post.mean.shape, torch.Size([4, 3, 5, m]))
                    post = fm.posterior(torch.rand(4, 3, 1, D, dtype=dtype))
                    self.assertEqual(post.mean.shape, torch.Size([4, 3, 1, m]))
                    self.assertTrue(bool(torch.isfinite(post.variance).all()))
                    ffm = fm.fantasize(torch.rand(3, 1, D, dtype=dtype), SobolQMCNormalSampler(
                        torch.Size([2])
                    ))  # fmt: skip
                    self.assertEqual(ffm.batch_shape, torch.Size([2, 4, 3]))
                    post = ffm.posterior(torch.rand(6, D, dtype=dtype))
                    self.assertEqual(post.mean.shape, torch.Size([2, 4, 3, 6, m]))

    def test_fantasy_points_are_conditioned_on(self):
        """Fantasies drawn with (nearly) no noise pin the fantasy posterior at ``X``."""
        dtype = torch.float64
        X = points(dtype, 2, 14)
        for name in ("ign", "gwi"):
            model = gp_adapters(dtype)[name]
            noise = torch.full((2, 1), 1e-10, dtype=dtype)
            fm = model.fantasize(X, SobolQMCNormalSampler(torch.Size([3])), noise)
            Yt = fm.conditioning_Y  # shape: (3, 2, 1), the draws
            with self.subTest(model=name):
                self.assertEqual(Yt.shape, torch.Size([3, 2, 1]))
                self.assertAllClose(fm.posterior(X).mean, Yt, atol=1e-4)
                self.assertGreater(float(Yt.std(0).min()), 0.0)

    def test_index_sampler_on_ensembles_and_empty_fantasies(self):
        dtype = torch.float64
        for name, model in ensemble_adapters(dtype).items():
            fm = model.fantasize(torch.rand(3, 1, D, dtype=dtype), IndexSampler(torch.Size([5])))
            values = fm.posterior(torch.rand(3, 4, D, dtype=dtype)).values
            with self.subTest(model=name):
                self.assertIsInstance(fm, ConditionedEnsembleSurrogate)
                self.assertEqual(values.shape[:2], torch.Size([5, 3]))
                self.assertEqual(values.shape[-3:-1], torch.Size([fm.num_members, 4]))
        Xq = points(dtype, 3, 15)
        for name, model in {**gp_adapters(dtype), **ensemble_adapters(dtype)}.items():
            fm = model.fantasize(torch.rand(2, 0, D, dtype=dtype), SobolQMCNormalSampler(
                torch.Size([3])
            ))  # fmt: skip
            with self.subTest(model=name):
                self.assertEqual(fm.batch_shape, torch.Size([3, 2]))
                self.assertAllClose(
                    fm.posterior(Xq).mean, model.posterior(Xq).mean.expand(3, 2, 3, -1)
                )

    def test_noise_broadcasts_to_the_observations(self):
        dtype = torch.float64
        Xc, Xq = points(dtype, 3, 27), points(dtype, 2, 28)
        for name, model in {"ign": ign(dtype), "vboot_rff": vboot_rff(dtype)}.items():
            Y = objective(Xc).expand(2, 3, 1)
            short = model.condition_on_observations(Xc, Y, noise=torch.tensor([0.05], dtype=dtype))
            full = model.condition_on_observations(Xc, Y, noise=torch.full_like(Y, 0.05))
            with self.subTest(model=name):
                self.assertEqual(short.batch_shape, torch.Size([2]))
                self.assertAllClose(short.posterior(Xq).mean, full.posterior(Xq).mean)
                self.assertAllClose(short.posterior(Xq).variance, full.posterior(Xq).variance)

    def test_errors(self):
        dtype = torch.float64
        X = points(dtype, 2, 16)
        sampler = SobolQMCNormalSampler(torch.Size([2]))
        for name, model in {"ign": ign(dtype), "vboot_rff": vboot_rff(dtype)}.items():
            with self.subTest(model=name):
                with self.assertRaises(InputTypeError):
                    model.fantasize(X, sampler, observation_noise=True)
                with self.assertRaises(InputTypeError):
                    model.fantasize(X, "sampler")
                with self.assertRaises(ShapeError):
                    model.fantasize(X, sampler, observation_noise=torch.ones(3, 1, dtype=dtype))
                with self.assertRaises(ShapeError):
                    model.condition_on_observations(X, torch.zeros(3, 1, dtype=dtype))
                with self.assertRaises(ShapeError):
                    model.condition_on_observations(X, torch.zeros(2, dtype=dtype))
                with self.assertRaises(ShapeError):
                    model.condition_on_observations(
                        X.expand(3, 2, D), torch.zeros(4, 2, 1, dtype=dtype)
                    )
                with self.assertRaises(InputTypeError):
                    model.condition_on_observations(X, torch.zeros(2, 1, dtype=torch.float32))
                with self.assertRaises(InputDataError):
                    model.condition_on_observations(
                        X, torch.zeros(2, 1, dtype=dtype), noise=-torch.ones(2, 1, dtype=dtype)
                    )
                with self.assertRaises(InputDataError):
                    model.condition_on_observations(
                        X, torch.full((2, 1), float("nan"), dtype=dtype)
                    )


def ensemble_moments(values: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance over members of ``(S, p)`` values (numpy)."""
    v = values.detach().double().numpy()
    return v.mean(0), np.cov(v, rowvar=False, ddof=1)


class TestEnsembleSquareRootUpdate(BotorchTestCase):
    def test_moments_are_the_gaussian_update_of_the_ensemble_moments(self):
        for dtype in DTYPES:
            tol = {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float32 else {"atol": 1e-8}
            Xc, Xq = points(dtype, 2, 17), points(dtype, 5, 18)
            for name, base in ensemble_adapters(dtype).items():
                model, mu, std = with_standardize(base)
                Y = objective(Xc) * 2.0
                cond = model.condition_on_observations(Xc, Y, noise=torch.full_like(Y, 0.02))
                with torch.no_grad():
                    prior = model.posterior(torch.cat([Xc, Xq])).values[..., 0]  # (S, 7)
                    post = cond.posterior(Xq).values[..., 0]  # (S, 5)
                mean, cov = ensemble_moments(prior)
                ref_mean, ref_cov = gaussian_update(mean, cov, Y[:, 0].numpy(), 0.02 * std**2, 2)
                got_mean, got_cov = ensemble_moments(post)
                with self.subTest(dtype=dtype, model=name):
                    self.assertEqual(post.shape[0], prior.shape[0])  # still S members
                    np.testing.assert_allclose(got_mean, ref_mean, **tol)
                    np.testing.assert_allclose(got_cov, ref_cov, **tol)
                    ens = cond.posterior(Xq)  # EnsemblePosterior mean / variance agree
                    np.testing.assert_allclose(ens.mean[..., 0].detach(), ref_mean, **tol)
                    np.testing.assert_allclose(
                        ens.variance[..., 0].detach(), np.diag(ref_cov), **tol
                    )

    def test_sequential_equals_joint_and_collapse(self):
        dtype = torch.float64
        X1, X2, Xq = points(dtype, 1, 19), points(dtype, 1, 20), points(dtype, 4, 21)
        for name, model in ensemble_adapters(dtype).items():
            Y1, Y2 = objective(X1), objective(X2) + 0.2
            seq = model.condition_on_observations(X1, Y1).condition_on_observations(X2, Y2)
            both = model.condition_on_observations(torch.cat([X1, X2]), torch.cat([Y1, Y2]))
            p_seq, p_both = seq.posterior(Xq), both.posterior(Xq)
            with self.subTest(model=name):
                self.assertIs(seq.base_model, model)
                self.assertAllClose(p_seq.mean, p_both.mean, atol=1e-8)
                self.assertAllClose(p_seq.variance, p_both.variance, atol=1e-8)
                pinned = model.condition_on_observations(X1, Y1, noise=torch.zeros_like(Y1))
                post = pinned.posterior(X1)
                self.assertTrue(bool((post.variance < 1e-6 * model.posterior(X1).variance).all()))
                self.assertAllClose(post.mean, Y1, atol=1e-5)

    def test_default_noise_is_the_adapter_noise(self):
        dtype = torch.float64
        Xc, Xq = points(dtype, 2, 22), points(dtype, 3, 23)
        model = vboot_rff(dtype)
        Y = objective(Xc)
        sigma2 = float(model.model.noise_)
        cond = model.condition_on_observations(Xc, Y)
        explicit = model.condition_on_observations(Xc, Y, noise=torch.full_like(Y, sigma2))
        self.assertAllClose(cond.posterior(Xq).mean, explicit.posterior(Xq).mean)
        swag = weight_ensemble(dtype, "swag")
        self.assertEqual(swag._noise_variance(Xq).shape, torch.Size([3, 1]))
        self.assertTrue(bool((swag._noise_variance(Xq) > 0).all()))


class TestLookaheadAcquisitions(BotorchTestCase):
    def test_qkg_and_qnipv_with_optimize_acqf(self):
        dtype = torch.float64
        bounds = torch.stack([torch.zeros(D, dtype=dtype), torch.ones(D, dtype=dtype)])
        mc_points = points(dtype, 32, 24)
        for name, model in {"ign": ign(dtype), "gwi": gwi(dtype)}.items():
            kg = qKnowledgeGradient(model, num_fantasies=4)
            x_kg, v_kg = optimize_acqf(
                kg, bounds, q=1, num_restarts=2, raw_samples=16, options={"maxiter": 10}
            )
            nipv = qNegIntegratedPosteriorVariance(model, mc_points=mc_points)
            x_iv, v_iv = optimize_acqf(
                nipv, bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 10}
            )
            with self.subTest(model=name):
                self.assertEqual(x_kg.shape, torch.Size([1, D]))
                self.assertEqual(x_iv.shape, torch.Size([2, D]))
                self.assertTrue(bool(torch.isfinite(v_kg)) and bool(torch.isfinite(v_iv)))
                self.assertTrue(bool(((x_kg >= 0) & (x_kg <= 1)).all()))
                # conditioning on two points lowers the integrated variance
                base = -model.posterior(mc_points).variance.mean()
                self.assertGreater(float(v_iv), float(base))

    def test_qkg_gradient_reaches_the_fantasy_points_and_ensembles_run(self):
        dtype = torch.float64
        X = torch.rand(3, 1 + 4, D, dtype=dtype, requires_grad=True)
        kg = qKnowledgeGradient(gwi(dtype), num_fantasies=4)
        kg(X).sum().backward()
        self.assertTrue(bool(torch.isfinite(X.grad).all()))
        self.assertGreater(float(X.grad[:, 0].abs().sum()), 0.0)
        model = vboot_rff(dtype)
        nipv = qNegIntegratedPosteriorVariance(model, mc_points=points(dtype, 16, 25))
        value = nipv(torch.rand(3, 2, D, dtype=dtype))
        self.assertEqual(value.shape, torch.Size([3]))
        self.assertTrue(bool(torch.isfinite(value).all()))


class TestDeepCopy(BotorchTestCase):
    def test_fitted_gwi_adapter_and_fantasy_models_deep_copy(self):
        dtype = torch.float64
        model = gwi(dtype)
        clone = copy.deepcopy(model)
        Xq = points(dtype, 3, 26)
        self.assertAllClose(clone.posterior(Xq).mean, model.posterior(Xq).mean)
        sampler = SobolQMCNormalSampler(torch.Size([2]))
        for name, base in {"gwi": model, "vboot_rff": vboot_rff(dtype)}.items():
            X = points(dtype, 2, 29).requires_grad_(True)
            fm = base.fantasize(X, sampler)
            fm_copy = copy.deepcopy(fm)
            with self.subTest(model=name):
                self.assertAllClose(fm_copy.posterior(Xq).mean, fm.posterior(Xq).mean.detach())
