"""Tests for gpext.variational.FeatureSpaceInducingGP (002 Eq. 7, Propositions 1 and 2)."""

import warnings

import gpytorch
import numpy as np
import pytest
import torch

from gpext.errors import InputDataError, NumericalError, NumericalWarning, ShapeError
from gpext.variational import FeatureSpaceInducingGP
from gpext.variational.feature_space_inducing_gp import _safe_cholesky

DTYPES = [torch.float32, torch.float64]


def _rbf_numpy(a, b, lengthscale, outputscale):
    d = (a[:, None, :] - b[None, :, :]) / lengthscale
    return outputscale * np.exp(-0.5 * (d**2).sum(-1))


def _model(m=6, d=3, dtype=torch.float64, batch_shape=None, seed=0):
    torch.manual_seed(seed)
    gp = FeatureSpaceInducingGP(m, d, batch_shape=batch_shape).to(dtype)
    with torch.no_grad():
        gp.pseudo_label_weight.normal_()
        gp.pseudo_label_bias.normal_()
        gp.covar_module.base_kernel.lengthscale = torch.rand(d) + 0.7
        gp.covar_module.outputscale = 1.3
    return gp


class TestFeatureSpaceInducingGP:
    def setup_method(self):
        torch.manual_seed(10)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_eq7_against_dense_numpy_reference(self, dtype):
        gp = _model(dtype=dtype)
        g = torch.randn(9, 3, dtype=dtype)
        f = gp(g)
        z = gp.inducing_points.detach().double().numpy()
        ls = gp.covar_module.base_kernel.lengthscale.detach().double().numpy()[0]
        os_ = float(gp.covar_module.outputscale.detach())
        w = gp.pseudo_label_weight.detach().double().numpy()
        b = float(gp.pseudo_label_bias.detach())
        gn = g.double().numpy()
        jitter = gpytorch.settings.variational_cholesky_jitter.value(dtype)
        kzz = _rbf_numpy(z, z, ls, os_) + jitter * np.eye(len(z))
        kgz = _rbf_numpy(gn, z, ls, os_)
        r = z @ w + b
        mean = kgz @ np.linalg.solve(kzz, r)
        cov = _rbf_numpy(gn, gn, ls, os_) - kgz @ np.linalg.solve(kzz, kgz.T)
        tol = (
            {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-9}
        )
        np.testing.assert_allclose(f.mean.detach().double().numpy(), mean, **tol)
        np.testing.assert_allclose(f.covariance_matrix.detach().double().numpy(), cov, **tol)
        m, v = gp.marginal(g)
        np.testing.assert_allclose(m.detach().double().numpy(), mean, **tol)
        np.testing.assert_allclose(
            v.detach().double().numpy(), np.clip(np.diag(cov), 0, None), **tol
        )
        torch.testing.assert_close(gp.pseudo_labels().detach().double(), torch.from_numpy(r), **tol)

    def test_covariance_is_lazy(self):
        from linear_operator.operators import DenseLinearOperator

        gp = _model(dtype=torch.float64, batch_shape=torch.Size([2]))
        g = torch.randn(3000, 3, dtype=torch.float64)
        f = gp(g)
        # nothing N x N is stored: the covariance is kernel + negated low-rank root, lazily
        assert not isinstance(f.lazy_covariance_matrix, DenseLinearOperator)
        assert f.lazy_covariance_matrix.shape == (2, 3000, 3000)
        m, v = gp.marginal(g)
        torch.testing.assert_close(f.mean, m)
        torch.testing.assert_close(f.variance, v.clamp_min(1e-10), atol=1e-9, rtol=1e-7)
        small = gp(g[:7])
        dense = gp.covar_module(g[:7]).to_dense()
        _, a = gp._project(g[:7])
        torch.testing.assert_close(small.covariance_matrix, dense - a.mT @ a)

    def test_matches_gpytorch_unwhitened_delta_strategy(self):
        """With q(u) = delta(r), GPyTorch's unwhitened SVGP predictive is Eq. 7."""
        gp = _model()

        class Ref(gpytorch.models.ApproximateGP):
            def __init__(self, z):
                dist = gpytorch.variational.DeltaVariationalDistribution(z.shape[0])
                strat = gpytorch.variational.UnwhitenedVariationalStrategy(
                    self, z, dist, learn_inducing_locations=False
                )
                super().__init__(strat)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = gp.covar_module

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(
                    self.mean_module(x), self.covar_module(x)
                )

        ref = Ref(gp.inducing_points.detach().clone()).double()
        with torch.no_grad():
            ref.variational_strategy._variational_distribution.variational_mean.copy_(
                gp.pseudo_labels()
            )
            ref.variational_strategy.variational_params_initialized.fill_(1)
        ref.eval()
        g = torch.randn(11, 3, dtype=torch.float64)
        with torch.no_grad():
            out, mine = ref(g), gp(g)
        torch.testing.assert_close(mine.mean, out.mean)
        torch.testing.assert_close(mine.covariance_matrix, out.covariance_matrix)

    def test_proposition1_z_gradient_does_not_involve_embedding(self):
        """grad_Z is the same with a trainable or a frozen g, and with detached features."""
        gp = _model()
        emb = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
        ).double()
        x = torch.randn(15, 2, dtype=torch.float64)
        y = torch.randn(15, dtype=torch.float64)

        def z_grad(features):
            gp.zero_grad()
            f = gp(features)
            cov = f.covariance_matrix + 0.1 * torch.eye(15, dtype=torch.float64)
            loss = -torch.distributions.MultivariateNormal(f.mean, cov).log_prob(y)
            return torch.autograd.grad(loss, gp.inducing_points)[0]

        trainable = z_grad(emb(x))
        for p in emb.parameters():
            p.requires_grad_(False)
        frozen = z_grad(emb(x))
        detached = z_grad(emb(x).detach())
        torch.testing.assert_close(trainable, frozen)
        torch.testing.assert_close(trainable, detached)
        assert trainable.abs().sum() > 0

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_proposition2_adding_inducing_points_never_increases_variance(self, dtype):
        for seed in range(5):
            gp = _model(m=4, d=2, dtype=dtype, seed=seed)
            g = torch.randn(50, 2, dtype=dtype) * 2
            _, before = gp.marginal(g)
            cov_before = gp(g).covariance_matrix
            gp.add_inducing_points(torch.randn(1, 2, dtype=dtype) * 2)
            assert gp.num_inducing == 5
            _, after = gp.marginal(g)
            tol = 1e-4 if dtype == torch.float32 else 1e-9
            assert bool((after <= before + tol).all())
            # the whole covariance decreases in the Loewner order
            eig = torch.linalg.eigvalsh(cov_before - gp(g).covariance_matrix)
            assert bool((eig > -tol * 10).all())

    def test_add_inducing_point_at_test_point_removes_its_variance(self):
        gp = _model(m=3, d=2)
        g = torch.randn(4, 2, dtype=torch.float64)
        gp.add_inducing_points(g[:1])
        _, v = gp.marginal(g)
        assert float(v[0]) < 1e-4

    def test_batch_heads_equal_separate_models(self):
        gp = _model(m=5, d=3, batch_shape=torch.Size([2]))
        g = torch.randn(7, 3, dtype=torch.float64)
        f = gp(g.unsqueeze(-3))
        assert f.mean.shape == (2, 7) and f.covariance_matrix.shape == (2, 7, 7)
        for h in range(2):
            single = FeatureSpaceInducingGP(5, 3, inducing_points=gp.inducing_points[h]).double()
            with torch.no_grad():
                single.pseudo_label_weight.copy_(gp.pseudo_label_weight[h])
                single.pseudo_label_bias.copy_(gp.pseudo_label_bias[h])
                single.covar_module.base_kernel.lengthscale = (
                    gp.covar_module.base_kernel.lengthscale[h]
                )
                single.covar_module.outputscale = gp.covar_module.outputscale[h]
            ref = single(g)
            torch.testing.assert_close(f.mean[h], ref.mean)
            torch.testing.assert_close(f.covariance_matrix[h], ref.covariance_matrix)
        # batched features (B, N, d) on a single head
        one = _model()
        gb = torch.randn(4, 6, 3, dtype=torch.float64)
        torch.testing.assert_close(one(gb).mean[2], one(gb[2]).mean)

    def test_initialize_from_features(self):
        gp = FeatureSpaceInducingGP(8, 2).double()
        g = torch.randn(100, 2, dtype=torch.float64)
        y = g @ torch.tensor([1.5, -0.5], dtype=torch.float64) + 0.3
        gp.initialize_from_features(g, y, ridge=1e-9, generator=torch.Generator().manual_seed(0))
        rows = (gp.inducing_points.detach()[:, None, :] == g[None]).all(-1).any(-1)
        assert bool(rows.all())
        torch.testing.assert_close(
            gp.pseudo_label_weight.detach(),
            torch.tensor([1.5, -0.5], dtype=torch.float64),
            atol=1e-5,
            rtol=0,
        )
        torch.testing.assert_close(float(gp.pseudo_label_bias), 0.3, atol=1e-5, rtol=0)
        heads = FeatureSpaceInducingGP(8, 2, batch_shape=torch.Size([3])).double()
        heads.initialize_from_features(g, y)
        assert heads.pseudo_label_weight.shape == (3, 2)

    def test_state_dict_round_trip(self):
        gp = _model()
        other = FeatureSpaceInducingGP(6, 3).double()
        other.load_state_dict(gp.state_dict())
        g = torch.randn(5, 3, dtype=torch.float64)
        torch.testing.assert_close(other(g).mean, gp(g).mean)

    @pytest.mark.parametrize("batch_shape", [None, torch.Size([2])])
    def test_fill_places_the_rest_between_rows(self, batch_shape):
        gp = _model(m=6, batch_shape=batch_shape)
        g = torch.randn(4, 3, dtype=torch.float64)
        gp.initialize_from_features(g, g[:, 0], generator=torch.Generator().manual_seed(1),
                                    fill=True)  # fmt: skip
        z = gp.inducing_points.reshape(-1, 6, 3)
        for zb in z:
            torch.testing.assert_close(zb[:4], g)  # every row once
            # the other two lie on segments between two different rows: z = g_i + u (g_j - g_i)
            for p in zb[4:]:
                found = False
                for i in range(4):
                    for j in range(4):
                        if i == j:
                            continue
                        d = g[j] - g[i]
                        u = float((p - g[i]) @ d / (d @ d))
                        if 0 <= u <= 1 and torch.allclose(g[i] + u * d, p, atol=1e-10):
                            found = True
                assert found
        with pytest.raises(InputDataError, match="at least num_inducing"):
            gp.initialize_from_features(g[:1], fill=True)  # nothing to interpolate between

    def test_errors(self):
        gp = _model()
        with pytest.raises(ShapeError, match="feature_dim"):
            gp(torch.randn(4, 2, dtype=torch.float64))
        with pytest.raises(ShapeError, match="N, 3"):
            gp(torch.randn(3, dtype=torch.float64))
        with pytest.raises(InputDataError, match="finite"):
            gp(torch.full((2, 3), float("nan"), dtype=torch.float64))
        with pytest.raises(ShapeError, match="inducing_points"):
            FeatureSpaceInducingGP(4, 2, inducing_points=torch.randn(3, 2))
        with pytest.raises(InputDataError, match="num_inducing"):
            FeatureSpaceInducingGP(0, 2)
        with pytest.raises(InputDataError, match="at least num_inducing"):
            gp.initialize_from_features(torch.randn(3, 3, dtype=torch.float64))
        with pytest.raises(ShapeError, match="add_inducing_points"):
            gp.add_inducing_points(torch.randn(2, 4))

    def test_safe_cholesky_fallback_and_failure(self):
        a = torch.diag(torch.tensor([1.0, -5e-12], dtype=torch.float64))  # fixable by jitter
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            chol = _safe_cholesky(a, 1e-12, "test")
        assert any(issubclass(w.category, NumericalWarning) for w in rec)
        assert torch.isfinite(chol).all()
        with pytest.raises(NumericalError, match="not positive definite"):
            _safe_cholesky(-torch.eye(2, dtype=torch.float64), 1e-8, "test")


def _dense_pseudo_label_solve(gp, g, y, noise, ridge):
    """numpy MAP of one head: sum_i (y_i - a_i^T r)^2 / v_i + c (r - r0)^T K_ZZ^{-1} (r - r0),
    c = ridge * mean(diag K_ZZ) / var(y), r0 = Z w + b (the linear pseudo-labels)."""
    with torch.no_grad():
        z = gp.inducing_points.detach().double().numpy()
        ls = gp.covar_module.base_kernel.lengthscale.detach().double().numpy()[0]
        os_ = float(gp.covar_module.outputscale.detach())
        r0 = z @ gp.pseudo_label_weight.detach().double().numpy()
        r0 = r0 + float(gp.pseudo_label_bias.detach())
    jitter = gpytorch.settings.variational_cholesky_jitter.value(gp.inducing_points.dtype)
    kzz = _rbf_numpy(z, z, ls, os_) + jitter * np.eye(len(z))
    kgz = _rbf_numpy(g, z, ls, os_)
    a = np.linalg.solve(kzz, kgz.T).T  # (N, m)
    v = os_ - (a * kgz).sum(-1) + noise
    w = 1.0 / v
    c = ridge * os_ / np.var(y)
    prior = c * np.linalg.inv(kzz)
    return np.linalg.solve((a * w[:, None]).T @ a + prior, a.T @ (w * y) + prior @ r0)


def _independent_objective(gp, g, y, noise):
    mean, var = gp.marginal(g)
    total = var + noise
    return float((0.5 * ((y - mean) ** 2 / total + total.log())).sum())


class TestSolvePseudoLabels:
    """Closed-form pseudo-labels: the minimiser of the independent form of 002 Eq. 5 over r."""

    def setup_method(self):
        torch.manual_seed(11)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_matches_dense_weighted_least_squares(self, dtype):
        gp = _model(m=6, d=3, dtype=dtype)
        g = torch.randn(40, 3, dtype=dtype)
        y = torch.sin(g.sum(-1)) + 0.1 * torch.randn(40, dtype=dtype)
        noise = torch.rand(40, dtype=dtype) * 0.2 + 0.05  # heteroscedastic
        ref = _dense_pseudo_label_solve(gp, g.double().numpy(), y.double().numpy(),
                                        noise.double().numpy(), ridge=0.3)  # fmt: skip
        # streamed in uneven batches: the same as one dense solve
        batches = [(g[s : s + 15], y[s : s + 15], noise[s : s + 15]) for s in range(0, 40, 15)]
        r = gp.solve_pseudo_labels(batches, ridge=0.3)
        tol = (
            {"atol": 1e-3, "rtol": 1e-3} if dtype == torch.float32 else {"atol": 1e-8, "rtol": 1e-8}
        )
        np.testing.assert_allclose(r.double().numpy(), ref, **tol)
        np.testing.assert_allclose(gp.pseudo_labels().detach().double().numpy(), ref, **tol)
        assert r.dtype == dtype

    def test_minimises_the_objective(self):
        gp = _model(m=5, d=2)
        g = torch.randn(60, 2, dtype=torch.float64)
        y = g[:, 0] ** 2 - g[:, 1] + 0.05 * torch.randn(60, dtype=torch.float64)
        noise = torch.tensor(0.05, dtype=torch.float64)
        before = _independent_objective(gp, g, y, noise)
        gp.solve_pseudo_labels([(g, y, noise)], ridge=0.0)
        after = _independent_objective(gp, g, y, noise)
        assert after < before - 1.0
        # a stationary point: the gradient with respect to the offset vanishes
        with torch.enable_grad():
            gp.pseudo_label_offset.requires_grad_(True)
            mean, var = gp.marginal(g)
            loss = (0.5 * (y - mean) ** 2 / (var + noise)).sum()
            (grad,) = torch.autograd.grad(loss, gp.pseudo_label_offset)
        assert float(grad.abs().max()) < 1e-6
        # the linear function r(z) is untouched; only the offset moved
        assert float(gp.pseudo_label_offset.detach().abs().max()) > 0

    def test_batch_heads_solve_each_head(self):
        gp = _model(m=4, d=2, batch_shape=torch.Size([3]))
        g = torch.randn(30, 2, dtype=torch.float64)
        y = torch.randn(3, 30, dtype=torch.float64)
        noise = torch.rand(3, 30, dtype=torch.float64) + 0.1
        r = gp.solve_pseudo_labels([(g, y, noise)], ridge=1e-3)
        assert r.shape == (3, 4)
        for h in range(3):
            single = FeatureSpaceInducingGP(4, 2, inducing_points=gp.inducing_points[h]).double()
            with torch.no_grad():
                single.pseudo_label_weight.copy_(gp.pseudo_label_weight[h])
                single.pseudo_label_bias.copy_(gp.pseudo_label_bias[h])
                single.covar_module.base_kernel.lengthscale = (
                    gp.covar_module.base_kernel.lengthscale[h]
                )
                single.covar_module.outputscale = gp.covar_module.outputscale[h]
            ref = single.solve_pseudo_labels([(g, y[h], noise[h])], ridge=1e-3)
            torch.testing.assert_close(r[h], ref)

    def test_prior_keeps_uninformed_pseudo_labels_linear(self):
        """An inducing point far from every feature keeps r(z); informed ones move."""
        gp = _model(m=4, d=2)
        with torch.no_grad():
            gp.inducing_points[-1] = torch.tensor([40.0, 40.0], dtype=torch.float64)
        g = 0.5 * torch.randn(80, 2, dtype=torch.float64)
        y = 5.0 + torch.sin(3 * g[:, 0])
        lin = gp._linear_pseudo_labels().detach().clone()
        r = gp.solve_pseudo_labels([(g, y, torch.tensor(0.01, dtype=torch.float64))])
        assert abs(float(r[-1] - lin[-1])) < 1e-6
        assert float((r[:-1] - lin[:-1]).abs().max()) > 0.1
        # the prior scales with the targets: no shrinkage without a ridge, the same
        # solution for targets and kernel scaled together
        free = gp.solve_pseudo_labels([(g, y, torch.tensor(0.01, dtype=torch.float64))], ridge=0)
        assert float((free[:-1] - r[:-1]).abs().max()) > 0

    def test_offset_in_state_dict_add_points_and_old_checkpoints(self):
        gp = _model(m=5, d=2)
        g = torch.randn(30, 2, dtype=torch.float64)
        gp.solve_pseudo_labels([(g, torch.randn(30, dtype=torch.float64), torch.tensor(0.1))])
        assert not gp.pseudo_label_offset.requires_grad
        other = FeatureSpaceInducingGP(5, 2).double()
        other.load_state_dict(gp.state_dict())
        torch.testing.assert_close(other(g).mean, gp(g).mean)
        old = {k: v for k, v in gp.state_dict().items() if k != "pseudo_label_offset"}
        other.load_state_dict(old)  # a checkpoint from before the offset existed
        assert float(other.pseudo_label_offset.abs().max()) == 0.0
        r_before = gp.pseudo_labels().detach()
        gp.add_inducing_points(torch.randn(2, 2, dtype=torch.float64))
        assert gp.pseudo_label_offset.shape == (7,)
        torch.testing.assert_close(gp.pseudo_labels().detach()[:5], r_before)
        gp.initialize_from_features(g)
        assert float(gp.pseudo_label_offset.abs().max()) == 0.0

    def test_errors(self):
        gp = _model()
        g, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
        noise = torch.tensor(0.1, dtype=torch.float64)
        with pytest.raises(InputDataError, match="ridge"):
            gp.solve_pseudo_labels([(g, y, noise)], ridge=-1.0)
        with pytest.raises(InputDataError, match="at least one batch"):
            gp.solve_pseudo_labels([])
        with pytest.raises(ShapeError, match="targets"):
            gp.solve_pseudo_labels([(g, y[:5], noise)])
        with pytest.raises(ShapeError, match="feature_dim"):
            gp.solve_pseudo_labels([(g[:, :2], y, noise)])
