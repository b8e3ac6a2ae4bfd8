"""ESS and mean-field VI on a linear-Gaussian model with a closed-form posterior."""

import math

import pytest
import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, NotFittedError, NumericalError, ShapeError
from gpext.subspace import (
    EllipticalSliceSampler,
    MeanFieldGaussian,
    OutputLikelihood,
    SubspaceModel,
    classification_average,
    regression_mixture_log_likelihood,
    regression_mixture_moments,
)

NOISE_VAR, PRIOR_STD, TEMP = 0.25, 1.5, 2.0


def _linear_problem(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    net = nn.Linear(5, 1, bias=False).to(dtype)
    center = torch.randn(5, generator=g, dtype=dtype)
    proj = torch.randn(3, 5, generator=g, dtype=dtype)
    x = torch.randn(40, 5, generator=g, dtype=dtype)
    theta_true = torch.randn(3, generator=g, dtype=dtype)
    y = x @ (center + proj.T @ theta_true) + math.sqrt(NOISE_VAR) * torch.randn(
        40, generator=g, dtype=dtype
    )
    model = SubspaceModel(
        net,
        center,
        proj,
        OutputLikelihood("gaussian", noise_variance=NOISE_VAR),
        prior_std=PRIOR_STD,
        temperature=TEMP,
    )
    a = x @ proj.T  # shape: (N, r)
    prec = torch.eye(3, dtype=dtype) / PRIOR_STD**2 + a.T @ a / (NOISE_VAR * TEMP)
    cov = torch.linalg.inv(prec)
    mean = cov @ a.T @ (y - x @ center) / (NOISE_VAR * TEMP)
    return model, x, y, mean, cov, prec


class TestEllipticalSliceSampler:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_closed_form_posterior(self, dtype):
        model, x, y, mean, cov, _ = _linear_problem(dtype)
        g = torch.Generator().manual_seed(1)
        s = model.sample_ess(x, y, 3000, burn_in=100, generator=g).double()
        sd = cov.diagonal().sqrt().double()
        # 3000 correlated draws: effective size >= 500, so 5 standard errors is < 0.25 sd
        assert ((s.mean(0) - mean.double()).abs() / sd).max() < 0.25
        emp_cov = torch.cov(s.T)
        rel = (emp_cov - cov.double()).norm() / cov.double().norm()
        assert rel < 0.2

    def test_prior_only_gives_prior_moments(self):
        ess = EllipticalSliceSampler(
            lambda t: torch.zeros(()), 2, prior_std=2.0, generator=torch.Generator().manual_seed(0)
        )
        s = ess.sample(4000)
        assert s.std(0).sub(2.0).abs().max() < 0.2
        assert s.mean(0).abs().max() < 0.25

    def test_errors(self):
        with pytest.raises(InputDataError, match="prior_std"):
            EllipticalSliceSampler(lambda t: 0.0, 2, prior_std=0.0)
        ess = EllipticalSliceSampler(lambda t: float("nan"), 2)
        with pytest.raises(NumericalError, match="initial state"):
            ess.sample(3)
        bad = EllipticalSliceSampler(
            lambda t: 0.0 if float(t.abs().sum()) == 0 else float("-inf"), 2, max_shrinks=5
        )
        with pytest.raises(NumericalError, match="shrinkages"):
            bad.sample(2)
        with pytest.raises(ShapeError, match="initial"):
            EllipticalSliceSampler(lambda t: 0.0, 2).sample(2, initial=torch.zeros(3))


class TestMeanFieldVI:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_mean_field_optimum(self, dtype):
        model, x, y, mean, _, prec = _linear_problem(dtype)
        g = torch.Generator().manual_seed(2)
        model.fit_vi(x, y, num_steps=1500, lr=0.03, num_mc=4, init_std=0.3, generator=g)
        q = model.variational
        # the mean-field optimum of a Gaussian posterior: exact mean, variances 1 / diag(precision)
        sd_mf = prec.diagonal().rsqrt()
        assert ((q.loc.detach() - mean).abs() / sd_mf).max() < 0.15
        assert ((q.scale.detach() / sd_mf) - 1).abs().max() < 0.15
        assert model.sample_vi(4, generator=g).shape == (4, 3)

    def test_kl_closed_form_matches_torch(self):
        q = MeanFieldGaussian(3, init_std=0.4)
        with torch.no_grad():
            q.loc.copy_(torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64))
        p = torch.distributions.Normal(torch.zeros(3, dtype=torch.float64), 1.7)
        ref = torch.distributions.kl_divergence(torch.distributions.Normal(q.loc, q.scale), p).sum()
        torch.testing.assert_close(q.kl_divergence(1.7), ref)
        assert abs(float(q.scale.detach()[0]) - 0.4) < 1e-9

    def test_minibatch_and_errors(self):
        model, x, y, *_ = _linear_problem(torch.float64)
        model.fit_vi(x, y, num_steps=5, batch_size=10, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(model.variational.loc).all()
        fresh = SubspaceModel(model.module, model.center, model.projection, model.likelihood)
        with pytest.raises(NotFittedError, match="fit_vi"):
            fresh.sample_vi(2)
        with pytest.raises(InputDataError, match="init_std"):
            MeanFieldGaussian(2, init_std=0.0)
        with pytest.raises(ShapeError, match="equal"):
            model.fit_vi(x, y[:5], num_steps=1)


class TestSubspaceModel:
    def test_weights_and_prediction_shapes(self):
        model, x, y, *_ = _linear_problem(torch.float64)
        thetas = torch.randn(4, 3, dtype=torch.float64)
        w = model.weights(thetas)
        torch.testing.assert_close(w[1], model.center + model.projection.T @ thetas[1])
        pred = model.predict(x[:7], thetas)
        torch.testing.assert_close(pred["means"][2], x[:7] @ w[2])
        assert pred["variances"].shape == (4, 7) and bool((pred["variances"] == NOISE_VAR).all())
        with pytest.raises(ShapeError, match="theta"):
            model.weights(torch.zeros(4))

    def test_constructor_errors(self):
        net = nn.Linear(2, 1)
        lik = OutputLikelihood("gaussian")
        with pytest.raises(ShapeError, match="projection"):
            SubspaceModel(net, torch.zeros(3), torch.zeros(2, 4), lik)
        with pytest.raises(ShapeError):
            SubspaceModel(net, torch.zeros(4), torch.zeros(2, 3), lik)
        with pytest.raises(InputDataError, match="finite"):
            SubspaceModel(net, torch.full((3,), float("nan")), torch.zeros(2, 3), lik)
        with pytest.raises(InputDataError, match="temperature"):
            SubspaceModel(net, torch.zeros(3), torch.zeros(2, 3), lik, temperature=0.0)

    def test_classification_predict(self):
        net = nn.Linear(2, 3)
        center = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        model = SubspaceModel(net, center, torch.randn(2, 9), OutputLikelihood("categorical"))
        x = torch.randn(6, 2)
        y = torch.randint(0, 3, (6,))
        ll = model.log_likelihood(torch.zeros(2), x, y)
        ref = -torch.nn.functional.cross_entropy(net(x), y, reduction="sum")
        torch.testing.assert_close(ll, ref)
        probs = model.predict(x, torch.randn(5, 2))["probs"]
        assert probs.shape == (5, 6, 3)
        avg = classification_average(probs)
        torch.testing.assert_close(avg.sum(-1), torch.ones(6))


class TestBayesianModelAveraging:
    def test_mixture_moments_and_likelihood(self):
        g = torch.Generator().manual_seed(0)
        means = torch.randn(4, 3, generator=g, dtype=torch.float64)
        variances = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.1
        target = torch.randn(3, generator=g, dtype=torch.float64)
        m, v = regression_mixture_moments(means, variances)
        torch.testing.assert_close(v, (variances + means**2).mean(0) - m**2)
        dens = torch.exp(torch.distributions.Normal(means, variances.sqrt()).log_prob(target)).mean(
            0
        )
        torch.testing.assert_close(
            regression_mixture_log_likelihood(means, variances, target), dens.log()
        )
        with pytest.raises(ShapeError):
            regression_mixture_moments(means, variances[:2])
        with pytest.raises(ShapeError):
            regression_mixture_log_likelihood(means, variances, target[:2])
        with pytest.raises(ShapeError):
            classification_average(torch.rand(3, 4))

    def test_output_likelihood(self):
        het = OutputLikelihood("heteroscedastic_gaussian", min_variance=0.01)
        out = torch.tensor([[0.5, -1.0], [1.0, 2.0]], dtype=torch.float64)
        y = torch.tensor([0.0, 1.5], dtype=torch.float64)
        var = torch.nn.functional.softplus(out[:, 1]) + 0.01
        ref = torch.distributions.Normal(out[:, 0], var.sqrt()).log_prob(y)
        torch.testing.assert_close(het.log_prob(out, y), ref)
        with pytest.raises(ShapeError):
            het.log_prob(out[:, :1], y)
        with pytest.raises(InputDataError, match="kind"):
            OutputLikelihood("poisson")
        with pytest.raises(InputDataError):
            OutputLikelihood("categorical").mean_variance(out)


class TestSelectTemperature:
    def test_scores_match_the_closed_form_held_out_density_and_pick_its_best(self):
        dtype = torch.float64
        model, x, y, *_ = _linear_problem(dtype)
        g = torch.Generator().manual_seed(3)
        x_val = torch.randn(200, 5, generator=g, dtype=dtype)
        theta_true = torch.linalg.lstsq(x @ model.projection.T, y - x @ model.center).solution
        f_val = x_val @ (model.center + model.projection.T @ theta_true)
        y_val = f_val + math.sqrt(NOISE_VAR) * torch.randn(200, generator=g, dtype=dtype)
        temps = [0.05, 1.0, 30.0, 1000.0]
        t, thetas, scores = model.select_temperature(
            x, y, x_val, y_val, temps, num_samples=400, burn_in=50, calibrate_variance=False,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        a, a_val = x @ model.projection.T, x_val @ model.projection.T
        ref = {}
        for temp in temps:
            prec = torch.eye(3, dtype=dtype) / PRIOR_STD**2 + a.T @ a / (NOISE_VAR * temp)
            cov = torch.linalg.inv(prec)
            mean = cov @ a.T @ (y - x @ model.center) / (NOISE_VAR * temp)
            m = x_val @ model.center + a_val @ mean
            v = (a_val @ cov * a_val).sum(-1) + NOISE_VAR
            ref[temp] = float(torch.distributions.Normal(m, v.sqrt()).log_prob(y_val).mean())
        assert t == max(ref, key=ref.get) and model.temperature == t
        assert thetas.shape == (400, 3)
        for temp in temps:  # Monte Carlo mixture of 400 correlated draws vs the exact density
            assert scores[temp] == pytest.approx(ref[temp], abs=0.05 + 0.02 * abs(ref[temp]))

    def test_vi_selection_keeps_the_winning_q_and_returns_the_shared_type(self):
        from gpext.fit import TemperatureSelection

        dtype = torch.float64
        model, x, y, *_ = _linear_problem(dtype)
        g = torch.Generator().manual_seed(3)
        x_val = torch.randn(100, 5, generator=g, dtype=dtype)
        theta_true = torch.linalg.lstsq(x @ model.projection.T, y - x @ model.center).solution
        f_val = x_val @ (model.center + model.projection.T @ theta_true)
        y_val = f_val + math.sqrt(NOISE_VAR) * torch.randn(100, generator=g, dtype=dtype)
        sel = model.select_temperature(
            x, y, x_val, y_val, [0.05, 1.0, 1000.0], num_samples=200, method="vi",
            vi_steps=200, calibrate_variance=False, generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        assert isinstance(sel, TemperatureSelection) and sel.samples.shape == (200, 3)
        t, thetas, scores = sel  # unpacks like the former triple
        assert t == max(scores, key=scores.get) == model.temperature
        assert scores[1000.0] < scores[t]  # a flat posterior predicts the held-out rows worse
        # the kept q is the winner's: fresh draws score like the returned ones
        fresh = model.sample_vi(2000, generator=torch.Generator().manual_seed(1))
        out = model.predict(x_val, fresh)
        again = regression_mixture_log_likelihood(out["means"], out["variances"], y_val)
        assert float(again.mean() if isinstance(again, torch.Tensor) else again) == pytest.approx(
            scores[t], abs=0.05
        )
        with pytest.raises(InputDataError, match="method"):
            model.select_temperature(x, y, x_val, y_val, [1.0], method="laplace")

    def test_variance_scale_is_the_held_out_maximum_likelihood(self):
        from scipy.optimize import minimize_scalar

        dtype = torch.float64
        model, x, y, *_ = _linear_problem(dtype)
        g = torch.Generator().manual_seed(4)
        x_val = torch.randn(300, 5, generator=g, dtype=dtype)
        theta_true = torch.linalg.lstsq(x @ model.projection.T, y - x @ model.center).solution
        f_val = x_val @ (model.center + model.projection.T @ theta_true)
        # held-out noise 4x the likelihood's: the network's variance is too small
        y_val = f_val + 2 * math.sqrt(NOISE_VAR) * torch.randn(300, generator=g, dtype=dtype)
        thetas = model.sample_ess(x, y, 64, burn_in=32, generator=torch.Generator().manual_seed(0))
        out = model.predict(x_val, thetas)

        def neg_ll(log_k):  # independent: log of the mean of the S Gaussian densities
            sd = (out["variances"] * math.exp(log_k)).sqrt()
            logp = torch.distributions.Normal(out["means"], sd).log_prob(y_val)
            return -float((logp.logsumexp(0) - math.log(logp.shape[0])).mean())

        ref = math.exp(minimize_scalar(neg_ll, bounds=(-7, 7), method="bounded",
                                       options={"xatol": 1e-10}).x)  # fmt: skip
        kappa = model.calibrate_variance(x_val, y_val, thetas)
        assert kappa == pytest.approx(ref, rel=1e-5) and model.variance_scale == kappa
        assert 2.5 < kappa < 6.0
        torch.testing.assert_close(model.predict(x_val, thetas)["variances"],
                                   out["variances"] * kappa)  # fmt: skip
        with pytest.raises(InputDataError, match="regression"):
            SubspaceModel(model.module, model.center, model.projection,
                          OutputLikelihood("categorical")).calibrate_variance(x, y, thetas)  # fmt: skip

    def test_select_temperature_calibrates_the_variance_by_default(self):
        dtype = torch.float64
        model, x, y, *_ = _linear_problem(dtype)
        g = torch.Generator().manual_seed(5)
        x_val = torch.randn(200, 5, generator=g, dtype=dtype)
        theta_true = torch.linalg.lstsq(x @ model.projection.T, y - x @ model.center).solution
        f_val = x_val @ (model.center + model.projection.T @ theta_true)
        y_val = f_val + 2 * math.sqrt(NOISE_VAR) * torch.randn(200, generator=g, dtype=dtype)
        kw = dict(num_samples=64, burn_in=32)
        _, _, plain = model.select_temperature(
            x, y, x_val, y_val, [1.0, 4.0], calibrate_variance=False,
            generator=torch.Generator().manual_seed(0), **kw,
        )  # fmt: skip
        assert model.variance_scale == 1.0
        _, _, cal = model.select_temperature(
            x, y, x_val, y_val, [1.0, 4.0], generator=torch.Generator().manual_seed(0), **kw
        )
        assert model.variance_scale > 2.5
        assert max(cal.values()) > max(plain.values()) + 0.05

    def test_errors(self):
        model, x, y, *_ = _linear_problem(torch.float64)
        with pytest.raises(InputDataError, match="temperatures"):
            model.select_temperature(x, y, x[:5], y[:5], [1.0, -2.0])
        with pytest.raises(ShapeError):
            model.select_temperature(x, y, x[:5], y[:4])

    def test_check_fit_warns_when_the_model_average_is_flat(self):
        from gpext.errors import VarianceCollapseWarning

        model, x, y, mean, *_ = _linear_problem(torch.float64)
        assert model.check_fit(x, y, mean[None])
        flat = torch.zeros(1, 5, dtype=torch.float64)  # w = 0: predicts 0 for every input
        zero = SubspaceModel(model.module, flat[0], model.projection, model.likelihood)
        with pytest.warns(VarianceCollapseWarning, match="SubspaceModel"):
            assert not zero.check_fit(x, y, torch.zeros(4, 3, dtype=torch.float64))


class TestSaveRestoreAndInputContract:
    def test_network_keeps_its_mode(self):
        # before: the constructor switched the user's network to eval mode for good
        model, x, y, *_ = _linear_problem(torch.float64)
        net = nn.Sequential(nn.Linear(5, 4), nn.Dropout(0.5), nn.Linear(4, 1)).double()
        from gpext.subspace import FlatParameters

        flat = FlatParameters(net)
        proj = torch.randn(2, flat.num_parameters, dtype=torch.float64)
        sub = SubspaceModel(net, flat.flatten(), proj, OutputLikelihood("gaussian"))
        assert net.training and all(m.training for m in net.modules())
        sub.fit_vi(x, y, num_steps=5, check_samples=0)
        thetas = sub.sample_vi(4, generator=torch.Generator().manual_seed(0))
        out = sub.predict(x, thetas)["means"]
        assert net.training and all(m.training for m in net.modules())
        net[1].eval()  # mixed modes are kept as they are
        sub.predict(x, thetas)
        assert [m.training for m in net.modules()] == [True, True, False, True]
        # evaluated in eval mode all the same: dropout is off, predictions are deterministic
        torch.testing.assert_close(sub.predict(x, thetas)["means"], out, rtol=0, atol=0)

    def test_state_after_fit_vi_round_trips_through_torch_save(self, tmp_path):
        # before: 'variational.*' were unexpected keys for a new instance, and the temperature
        # and variance scale were lost
        model, x, y, *_ = _linear_problem(torch.float64)
        model.fit_vi(x, y, num_steps=20, check_samples=0)
        model.variance_scale = 2.5
        torch.save(model.state_dict(), tmp_path / "sub.pt")
        net = nn.Linear(5, 1, bias=False).double()
        fresh = SubspaceModel(
            net, torch.zeros(5, dtype=torch.float64), torch.zeros(3, 5, dtype=torch.float64),
            OutputLikelihood("gaussian", noise_variance=NOISE_VAR), prior_std=PRIOR_STD,
        )  # fmt: skip
        fresh.load_state_dict(torch.load(tmp_path / "sub.pt"))
        assert fresh.temperature == TEMP and fresh.variance_scale == 2.5
        thetas = fresh.sample_vi(8, generator=torch.Generator().manual_seed(3))
        ref = model.sample_vi(8, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(thetas, ref, rtol=0, atol=0)
        a, b = fresh.predict(x, thetas), model.predict(x, ref)
        torch.testing.assert_close(a["means"], b["means"], rtol=0, atol=0)
        torch.testing.assert_close(a["variances"], b["variances"], rtol=0, atol=0)

    def test_inputs(self):
        model, x, y, *_ = _linear_problem(torch.float64)
        thetas = model.sample_ess(
            x.numpy(), y.tolist(), 4, generator=torch.Generator().manual_seed(0)
        )
        assert model.predict(x[:3].numpy(), thetas.numpy())["means"].shape == (4, 3)
        with pytest.raises(InputDataError, match="at least one row"):  # raw error before
            model.predict(x[:0], thetas)
        with pytest.raises(InputDataError, match="finite"):  # NaN predictions before
            model.predict(torch.full((2, 5), float("nan"), dtype=torch.float64), thetas)
        with pytest.raises(InputDataError, match="network can evaluate"):  # raw matmul error
            model.predict(torch.zeros(2, 4, dtype=torch.float64), thetas)
        with pytest.raises(InputDataError, match="network can evaluate"):
            model.sample_ess(x[:, 0], y, 2)
        with pytest.raises(ShapeError, match="one prediction per row"):
            model.predict(x[None], thetas)
        with pytest.raises(InputTypeError, match="float64"):
            model.predict(x.float(), thetas)
        with pytest.raises(InputTypeError, match="float32 or float64"):
            model.fit_vi(x.half(), y, num_steps=2)
