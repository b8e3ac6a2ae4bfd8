"""Held-out tuning of weight-space inference (gpext.subspace.tuning)."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats

from gpext.errors import InputDataError, InputTypeError, ShapeError, VarianceCollapseWarning
from gpext.fit import TemperatureSelection
from gpext.nn import MLP, HeteroscedasticMLP
from gpext.subspace import (
    SWAG,
    FlatParameters,
    HyperparameterSelection,
    MultiSWAG,
    OutputLikelihood,
    SubspaceModel,
    TrajectoryCollector,
    predict_weight_samples,
    regression_network,
    select_by_validation,
    select_likelihood,
    select_mixture_temperature,
    select_noise_variance,
    select_prior_std,
    select_swag_scale,
    select_temperature,
    temperature_grid,
    validation_log_likelihood,
)

DTYPES = (torch.float32, torch.float64)


def _data(dtype, n=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=dtype) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=dtype)
    return x, y


def _swag(net, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    traj = TrajectoryCollector(net, max_deviations=10)
    w0 = FlatParameters(net).flatten().detach()
    for _ in range(10):
        traj.collect(w0 + 0.05 * torch.randn(w0.shape, generator=gen, dtype=dtype))
    return SWAG.from_trajectory(traj)


class TestGridAndScore:
    def test_temperature_grid(self):
        assert temperature_grid(400, 20, (0.0, 1.0)) == [1.0, 20.0]
        assert temperature_grid(20, 20) == [1.0]
        assert len(temperature_grid(400, 20)) == 8
        with pytest.raises(InputDataError):
            temperature_grid(400, 20, ())

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_validation_log_likelihood_matches_scipy(self, dtype):
        gen = torch.Generator().manual_seed(0)
        means = torch.randn(4, 9, generator=gen, dtype=dtype)
        var = torch.rand(4, 9, generator=gen, dtype=dtype) + 0.1
        y = torch.randn(9, generator=gen, dtype=dtype)
        got = validation_log_likelihood({"means": means, "variances": var}, y)
        lp = stats.norm.logpdf(
            y.double().numpy(), means.double().numpy(), var.double().sqrt().numpy()
        )
        ref = float(np.mean(special.logsumexp(lp, axis=0) - math.log(4)))
        assert math.isclose(got, ref, rel_tol=1e-5)
        probs = torch.softmax(torch.randn(3, 5, 4, generator=gen, dtype=dtype), -1)
        labels = torch.tensor([0, 1, 2, 3, 0])
        got = validation_log_likelihood({"probs": probs}, labels)
        ref = np.log(probs.double().mean(0).numpy()[np.arange(5), labels.numpy()]).mean()
        assert math.isclose(got, ref, rel_tol=1e-6)
        with pytest.raises(ShapeError):
            validation_log_likelihood({"means": means, "variances": var}, y[:3])
        with pytest.raises(InputDataError):
            validation_log_likelihood({"other": means}, y)

    def test_select_by_validation(self):
        sel = select_by_validation(
            lambda v: (-((v - 2) ** 2), torch.tensor(v)), [1, 2, 3], parameter="p"
        )
        assert isinstance(sel, HyperparameterSelection) and sel.value == 2 and sel.parameter == "p"
        assert sel.scores == {1: -1.0, 2: 0.0, 3: -1.0} and int(sel.samples) == 2
        value, samples, scores, *_ = sel  # unpacks like TemperatureSelection
        assert HyperparameterSelection._fields[1:3] == TemperatureSelection._fields[1:3]
        assert select_by_validation(lambda v: float("nan") if v == 1 else 0.0, [1, 2]).value == 2
        with pytest.raises(InputDataError):
            select_by_validation(lambda v: 0.0, [])
        with pytest.raises(InputDataError, match="non-finite"):
            select_by_validation(lambda v: float("nan"), [1, 2])


class TestSelectNoiseVariance:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_one_network_is_the_closed_form(self, dtype):
        torch.manual_seed(0)
        x, y = _data(dtype)
        net = MLP(2, [8], 1).to(dtype)
        w = FlatParameters(net).flatten().detach()[None]
        lik = OutputLikelihood("homoscedastic_gaussian")
        sel = select_noise_variance(net, w, x, y, lik)
        with torch.no_grad():
            expected = float(((y - net(x)[:, 0]) ** 2).double().mean())
        assert sel.parameter == "noise_variance" and sel.samples is None
        assert math.isclose(sel.value, expected, rel_tol=1e-6)
        assert lik.noise_variance == sel.value

    def test_mixture_matches_scipy(self):
        torch.manual_seed(0)
        dtype = torch.float64
        x, y = _data(dtype)
        net = MLP(2, [8], 1).to(dtype)
        w = _swag(net, dtype).sample(5, scale=1.0, generator=torch.Generator().manual_seed(0))
        lik = OutputLikelihood("gaussian", noise_variance=1.0)
        sel = select_noise_variance(net, w, x, y, lik)
        means = predict_weight_samples(net, w, x, lik)["means"].numpy()

        def nll(log_var):
            lp = stats.norm.logpdf(y.numpy(), means, math.exp(0.5 * log_var))
            return -np.mean(special.logsumexp(lp, axis=0) - math.log(5))

        ref = optimize.minimize_scalar(
            nll, bounds=(-12, 3), method="bounded", options={"xatol": 1e-9}
        )
        assert math.isclose(math.log(sel.value), ref.x, abs_tol=1e-4)
        assert math.isclose(sel.scores[sel.value], -ref.fun, rel_tol=1e-7)

    def test_errors(self):
        net = HeteroscedasticMLP(2, [4])
        w = FlatParameters(net).flatten().detach()[None]
        x, y = _data(torch.float32)
        with pytest.raises(InputDataError, match="heteroscedastic"):
            select_noise_variance(net, w, x, y, OutputLikelihood("heteroscedastic_gaussian"))
        net = MLP(2, [4], 1)
        w = FlatParameters(net).flatten().detach()
        lik = OutputLikelihood("gaussian")
        with pytest.raises(ShapeError):
            select_noise_variance(net, w, x, y, lik)
        with pytest.raises(ShapeError):
            select_noise_variance(net, w[None], x, y[:5], lik)
        with pytest.raises(InputTypeError):
            select_noise_variance(net, w[None], x, y, "gaussian")


class TestSelectSwagScale:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_common_random_numbers_and_stored_scale(self, dtype):
        torch.manual_seed(0)
        x, y = _data(dtype)
        net = MLP(2, [8], 1).to(dtype)
        swag = _swag(net, dtype)
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        sel = select_swag_scale(net, swag, x, y, lik, num_samples=7, max_scale=2.0,
                                generator=torch.Generator().manual_seed(3))  # fmt: skip
        assert sel.parameter == "swag_scale" and 0.0 <= sel.value <= 2.0
        assert swag.scale == sel.value and sel.samples.shape == (7, swag.num_parameters)
        assert sel.samples.dtype == dtype
        assert 0.0 in sel.scores and max(sel.scores.values()) == sel.scores[sel.value]
        # the samples are the scale-1 draw of the same generator, rescaled around the mean
        unit = swag.sample(7, scale=1.0, generator=torch.Generator().manual_seed(3))
        expected = swag.mean + math.sqrt(sel.value) * (unit - swag.mean)
        torch.testing.assert_close(sel.samples, expected)
        # the score of each scale is the validation log-likelihood of those samples
        for s in (0.0, 2.0):
            w = swag.mean + math.sqrt(s) * (unit - swag.mean)
            pred = predict_weight_samples(net, w, x, lik)
            assert math.isclose(sel.scores[s], validation_log_likelihood(pred, y), rel_tol=1e-6)

    def test_joint_noise_and_mixture(self):
        torch.manual_seed(0)
        dtype = torch.float64
        x, y = _data(dtype)
        net = MLP(2, [8], 1).to(dtype)
        multi = MultiSWAG([_swag(net, dtype, 0), _swag(net, dtype, 1)])
        lik = OutputLikelihood("homoscedastic_gaussian", noise_variance=10.0)
        sel = select_swag_scale(net, multi, x, y, lik, num_samples=6,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert lik.noise_variance == sel.details["noise_variance"] < 10.0
        assert all(c.scale == sel.value for c in multi.components)
        # the noise is the held-out optimum at the two component means (scale 0), first
        means = torch.stack([c.mean for c in multi.components]).repeat_interleave(3, 0)
        ref = select_noise_variance(net, means, x, y, OutputLikelihood("gaussian"))
        assert math.isclose(lik.noise_variance, ref.value, rel_tol=1e-6)
        # and the scale's scores are those at that noise
        unit = multi.sample(6, scale=1.0, generator=torch.Generator().manual_seed(0))
        w = means + math.sqrt(sel.value) * (unit - means)
        pred = predict_weight_samples(net, w, x, lik)
        assert math.isclose(sel.scores[sel.value], validation_log_likelihood(pred, y), rel_tol=1e-6)

    def test_batch_norm_statistics(self):
        """Draws of a batch-norm network are scored with their own (or the given) statistics."""
        import warnings

        from gpext.errors import BatchNormWarning

        torch.manual_seed(0)
        x, y = _data(torch.float64)
        net = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        ).double()
        with torch.no_grad():
            net(x + 1.0)  # running statistics that belong to no draw
        net.eval()
        swag = _swag(net, torch.float64)
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        with pytest.warns(BatchNormWarning):
            select_swag_scale(net, swag, x, y, lik, num_samples=3,
                              generator=torch.Generator().manual_seed(1))  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error", BatchNormWarning)
            sel = select_swag_scale(net, swag, x, y, lik, num_samples=3, bn_inputs=x,
                                    generator=torch.Generator().manual_seed(1))  # fmt: skip
            own = dict(net.named_buffers())
            fixed = select_swag_scale(net, swag, x, y, lik, num_samples=3, buffers=own,
                                      generator=torch.Generator().manual_seed(1))  # fmt: skip
        unit = swag.sample(3, scale=1.0, generator=torch.Generator().manual_seed(1))
        for s in (0.0, sel.value):
            w = swag.mean + math.sqrt(s) * (unit - swag.mean)
            pred = predict_weight_samples(net, w, x, lik, bn_inputs=x)
            assert math.isclose(sel.scores[s], validation_log_likelihood(pred, y), rel_tol=1e-6)
        w = swag.mean + math.sqrt(fixed.value) * (unit - swag.mean)
        pred = predict_weight_samples(net, w, x, lik, buffers=own)
        assert math.isclose(fixed.scores[fixed.value], validation_log_likelihood(pred, y),
                            rel_tol=1e-6)  # fmt: skip

    def test_errors(self):
        net = MLP(2, [4], 1)
        x, y = _data(torch.float32)
        swag = _swag(net, torch.float32)
        lik = OutputLikelihood("gaussian")
        with pytest.raises(InputDataError):
            select_swag_scale(net, swag, x, y, lik, max_scale=0.0)
        with pytest.raises(InputTypeError):
            select_swag_scale(net, "swag", x, y, lik)
        with pytest.raises(ShapeError):
            select_swag_scale(net, swag, x, y[:3], lik)
        het = OutputLikelihood("heteroscedastic_gaussian")
        with pytest.raises(InputDataError):
            select_swag_scale(HeteroscedasticMLP(2, [4]), swag, x, y, het, tune_noise=True)


class TestSelectPriorStdAndLikelihood:
    def test_prior_std(self):
        torch.manual_seed(0)
        dtype = torch.float64
        x, y = _data(dtype)
        net = MLP(2, [8], 1).to(dtype)
        swag = _swag(net, dtype)
        proj = swag.factor().mT[:3].contiguous()
        model = SubspaceModel(
            net, swag.mean, proj, OutputLikelihood("gaussian", noise_variance=0.05)
        )
        sel = select_prior_std(model, x, y, x, y, (0.5, 2.0), num_samples=4, burn_in=2,
                               generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert sel.parameter == "prior_std" and model.prior_std == sel.value
        assert set(sel.scores) == {0.5, 2.0} and sel.samples.shape == (4, 3)
        assert sel.scores[sel.value] == max(sel.scores.values())
        with pytest.raises(InputDataError):
            select_prior_std(model, x, y, x, y, (0.0,))
        # the temperature on the promoted grid, through the model's own selection
        sel = select_temperature(model, x, y, x, y, (0.0, 1.0), num_samples=4, burn_in=2,
                                 generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert sorted(sel.scores) == temperature_grid(x.shape[0], 3, (0.0, 1.0))
        assert sel.value == model.temperature and sel.parameter == "temperature"
        assert sel.details["variance_scale"] == model.variance_scale
        with pytest.raises(InputTypeError):
            select_temperature(net, x, y, x, y)
        with pytest.raises(InputTypeError):
            select_prior_std(net, x, y, x, y)

    def test_likelihood_choice_and_networks(self):
        seen = []

        def score(lik):
            seen.append(lik)
            return (1.0 if lik.kind == "homoscedastic_gaussian" else 0.0), lik.kind.upper()

        sel = select_likelihood(score)
        assert sel.value == "homoscedastic_gaussian" and sel.parameter == "likelihood"
        assert sel.details["heteroscedastic_gaussian"][1] == "HETEROSCEDASTIC_GAUSSIAN"
        assert sel.details["homoscedastic_gaussian"][0] is seen[0]
        assert regression_network("heteroscedastic_gaussian", 3)(torch.zeros(2, 3)).shape == (2, 2)
        assert regression_network(seen[0], 3)(torch.zeros(2, 3)).shape == (2, 1)
        with pytest.raises(InputDataError):
            regression_network("categorical", 3)
        with pytest.raises(InputDataError):
            select_likelihood(score, ("poisson",))


class TestSelectMixtureTemperature:
    """One temperature exponent for an equal-weight mixture of subspace posteriors."""

    @staticmethod
    def _model(dtype, seed, rank=3):
        torch.manual_seed(seed)
        net = MLP(2, [8], 1).to(dtype)
        swag = _swag(net, dtype, seed)
        proj = swag.factor().mT[:rank].contiguous()
        return SubspaceModel(
            net, swag.mean, proj, OutputLikelihood("gaussian", noise_variance=0.05)
        )

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("calibrate", [True, False])
    def test_one_model_equals_its_own_selection(self, dtype, calibrate):
        # one model: the mixture's selection is the model's own, variance scale included
        x, y = _data(dtype)
        xv, yv = _data(dtype, n=30, seed=1)
        exps = (-1.0, 0.0, 1.0)
        a, b = self._model(dtype, 0), self._model(dtype, 0)
        sel = select_mixture_temperature([a], x, y, xv, yv, exps, num_samples=5, burn_in=3,
                                         calibrate_variance=calibrate,
                                         generator=torch.Generator().manual_seed(3))  # fmt: skip
        ref = b.select_temperature(x, y, xv, yv, temperature_grid(60, 3, exps), num_samples=5,
                                   burn_in=3, calibrate_variance=calibrate,
                                   generator=torch.Generator().manual_seed(3))  # fmt: skip
        got = {temperature_grid(60, 3, (e,))[0]: s for e, s in sel.scores.items()}
        assert got.keys() == ref.scores.keys()
        for t in got:
            assert math.isclose(got[t], ref.scores[t], rel_tol=1e-5, abs_tol=1e-6)
        assert a.temperature == ref.temperature == sel.details["temperatures"][0]
        # (the flat optimum of kappa moves with float32 rounding of the score)
        tol = 1e-6 if dtype == torch.float64 else 1e-3
        assert math.isclose(a.variance_scale, b.variance_scale, rel_tol=tol)
        assert sel.details["variance_scale"] == a.variance_scale
        assert (a.variance_scale != 1.0) == calibrate
        torch.testing.assert_close(sel.samples[0], ref.samples)

    def test_pooled_score_and_per_rank_temperatures(self):
        dtype = torch.float64
        x, y = _data(dtype)
        xv, yv = _data(dtype, n=30, seed=1)
        models = [self._model(dtype, 0, rank=3), self._model(dtype, 1, rank=2)]
        sel = select_mixture_temperature(
            models,
            x,
            y,
            xv,
            yv,
            (0.0, 1.0),
            num_samples=4,
            burn_in=2,
            generator=torch.Generator().manual_seed(0),
        )
        kappa = sel.details["variance_scale"]
        assert all(m.variance_scale == kappa for m in models) and kappa != 1.0
        assert sel.parameter == "temperature_exponent" and sel.value in (0.0, 1.0)
        assert sel.scores[sel.value] == max(sel.scores.values())
        assert [s.shape for s in sel.samples] == [(4, 3), (4, 2)]
        temps = [temperature_grid(60, r, (sel.value,))[0] for r in (3, 2)]
        assert [m.temperature for m in models] == temps == sel.details["temperatures"]
        # the score of the winner is the held-out density of the pooled draws (scipy), at the
        # kappa the models now predict with, and no other kappa scores higher
        preds = [m.predict(xv, t) for m, t in zip(models, sel.samples)]
        means = torch.cat([p["means"] for p in preds]).numpy()
        var = torch.cat([p["variances"] for p in preds]).numpy()

        def score(k):
            lp = stats.norm.logpdf(yv.numpy(), means, np.sqrt(var * k))
            return float(np.mean(special.logsumexp(lp, axis=0) - math.log(8)))

        assert math.isclose(sel.scores[sel.value], score(1.0), rel_tol=1e-9)
        best = optimize.minimize_scalar(lambda t: -score(math.exp(t) / kappa), bounds=(-3, 3),
                                        method="bounded")  # fmt: skip
        assert -best.fun <= sel.scores[sel.value] + 1e-7

    def test_vi_keeps_the_winning_q(self):
        dtype = torch.float64
        x, y = _data(dtype)
        xv, yv = _data(dtype, n=30, seed=1)
        models = [self._model(dtype, 0), self._model(dtype, 1)]
        fitted = []  # (model index, temperature, q) of every fit
        for k, m in enumerate(models):

            def fit_vi(*args, _m=m, _k=k, _fit=m.fit_vi, **kwargs):
                out = _fit(*args, **kwargs)
                fitted.append((_k, _m.temperature, _m.variational))
                return out

            m.fit_vi = fit_vi
        with pytest.warns(VarianceCollapseWarning):  # untrained networks explain nothing
            sel = select_mixture_temperature(
                models,
                x,
                y,
                xv,
                yv,
                (0.0, 2.0),
                method="vi",
                vi_steps=30,
                num_samples=4,
                generator=torch.Generator().manual_seed(0),
            )
        assert len(fitted) == 4 and len({id(q) for _, _, q in fitted}) == 4
        for k, m in enumerate(models):
            assert sel.samples[k].shape == (4, 3)
            (q,) = [q for j, t, q in fitted if j == k and t == m.temperature]
            assert m.variational is q
        assert sel.details["temperatures"] == [m.temperature for m in models]

    def test_errors(self):
        dtype = torch.float64
        x, y = _data(dtype)
        model = self._model(dtype, 0)
        with pytest.raises(InputTypeError, match="SubspaceModel"):
            select_mixture_temperature([], x, y, x, y)
        with pytest.raises(InputTypeError, match="SubspaceModel"):
            select_mixture_temperature([model, "net"], x, y, x, y)
        with pytest.raises(InputTypeError):
            select_mixture_temperature(model, x, y, x, y)
        with pytest.raises(InputDataError, match="method"):
            select_mixture_temperature([model], x, y, x, y, method="hmc")
        with pytest.raises(InputDataError, match="exponents"):
            select_mixture_temperature([model], x, y, x, y, (float("nan"),))
        with pytest.raises(ShapeError):
            select_mixture_temperature([model], x, y, x, y[:5], (0.0,))
