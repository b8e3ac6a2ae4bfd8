"""BoTorch conformance of the ensemble adapters (SWAG, MultiSWAG, subspace ESS / VI, VBoot)."""

from __future__ import annotations

import pytest
import torch
from _botorch_fixtures import D, data, vboot_mlp, vboot_rff, weight_ensemble
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.sampling.get_sampler import get_sampler
from botorch.sampling.index_sampler import IndexSampler
from botorch.utils.testing import BotorchTestCase

from gpext.bootstrap import VBootRFF
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.integrations.botorch import (
    VBootSurrogate,
    WeightEnsembleSurrogate,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.nn import MLP
from gpext.subspace import (
    SWAG,
    MultiSWAG,
    OutputLikelihood,
    SubspaceModel,
    predict_weight_samples,
)

DTYPES = (torch.float32, torch.float64)
METHODS = ("swag", "multiswag", "pca_ess", "pca_vi", "last_layer")


def ensembles(dtype):
    out = {m: weight_ensemble(dtype, m) for m in METHODS}
    out.update({"vboot_rff": vboot_rff(dtype), "vboot_mlp": vboot_mlp(dtype)})
    return out


class TestSampleEnsembleSurrogates(BotorchTestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(0)

    def test_posterior_shapes_batch_q_d(self):
        for dtype in DTYPES:
            for name, model in ensembles(dtype).items():
                for batch in ((), (3,), (2, 3)):
                    X = torch.rand(*batch, 4, D, dtype=dtype)
                    post = model.posterior(X)
                    self.assertIsInstance(post, EnsemblePosterior, name)
                    s = post.ensemble_size
                    self.assertEqual(post.values.shape, torch.Size([*batch, s, 4, 1]), name)
                    self.assertEqual(post.mean.shape, torch.Size([*batch, 4, 1]), name)
                    self.assertEqual(post.mean.dtype, dtype)
                    self.assertIsInstance(get_sampler(post, torch.Size([6])), IndexSampler)
                    self.assertEqual(
                        post.rsample(torch.Size([6])).shape, torch.Size([6, *batch, 4, 1])
                    )

    def test_mean_is_member_average(self):
        x = torch.rand(9, D, dtype=torch.float64)
        model = vboot_rff(torch.float64)
        means, _ = model.model.predict_mixture(x)  # (K, M) particle means
        post = model.posterior(x.unsqueeze(-2))
        self.assertTrue(torch.allclose(post.mean.reshape(-1), means.mean(0), atol=1e-10))
        self.assertTrue(torch.allclose(post.variance.reshape(-1), means.var(0), atol=1e-10))
        for method in METHODS:
            model = weight_ensemble(torch.float64, method)
            pred = predict_weight_samples(model.model, model.sample_weights, x, model.likelihood)
            post = model.posterior(x.unsqueeze(0))
            self.assertTrue(torch.allclose(post.values[..., 0], pred["means"], atol=1e-10), method)
            self.assertTrue(
                torch.allclose(post.mean.reshape(-1), pred["means"].mean(0), atol=1e-10)
            )

    def test_members_from_swag_and_subspace(self):
        torch.manual_seed(4)
        net = MLP(D, [5], 1).double()
        d = sum(p.numel() for p in net.parameters())
        g = torch.Generator().manual_seed(0)
        swags = [
            SWAG(torch.randn(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64) * 2,
                 torch.randn(3, d, dtype=torch.float64))
            for _ in range(2)
        ]  # fmt: skip
        model = WeightEnsembleSurrogate.from_swag(net, MultiSWAG(swags), 3, generator=g)
        self.assertEqual(model.num_members, 6)
        g2 = torch.Generator().manual_seed(0)
        expected = MultiSWAG(swags).sample(6, generator=g2)  # 6 in all, 3 per component
        self.assertTrue(torch.allclose(model.sample_weights, expected))
        sub = SubspaceModel(net, swags[0].mean, torch.randn(2, d, dtype=torch.float64),
                            OutputLikelihood("gaussian"))  # fmt: skip
        thetas = torch.randn(4, 2, dtype=torch.float64)
        model = WeightEnsembleSurrogate.from_subspace(sub, thetas)
        self.assertTrue(
            torch.allclose(model.sample_weights, swags[0].mean + thetas @ sub.projection)
        )
        x = torch.rand(3, D, dtype=torch.float64)
        ref = torch.stack([sub.flat.functional_call(w, x)[:, 0] for w in model.sample_weights])
        self.assertTrue(torch.allclose(model.posterior(x).values[..., 0], ref))

    def test_outcome_and_input_transforms(self):
        x, y, _ = data(torch.float64)
        x_raw, y_raw = 4.0 * x - 1.0, 3.0 * y + 7.0
        model = fit_weight_ensemble(
            x_raw, y_raw, method="swag", num_samples=3, hidden_features=(6,), epochs=6,
            swa_epochs=3, input_transform=Normalize(D), outcome_transform=Standardize(1),
            generator=torch.Generator().manual_seed(0),
            calibrate=False,  # members compared as they are (calibration: its own tests)
        )  # fmt: skip
        xq = torch.rand(5, D, dtype=torch.float64) * 4.0 - 1.0
        raw = predict_weight_samples(
            model.model, model.sample_weights, model.input_transform(xq), model.likelihood
        )["means"]
        sd, mu = model.outcome_transform.stdvs.squeeze(), model.outcome_transform.means.squeeze()
        post = model.posterior(xq.unsqueeze(0))
        self.assertTrue(torch.allclose(post.values[..., 0], raw * sd + mu, atol=1e-10))
        # VBoot with a Standardize outcome transform
        vb = VBootSurrogate(
            VBootRFF(num_features=20, num_particles=4, lengthscale=0.3, outputscale=1.0, noise=1e-2),
            train_X=x, train_Y=y_raw, outcome_transform=Standardize(1),
        )  # fmt: skip
        vb = fit_gpext_surrogate(vb, generator=torch.Generator().manual_seed(0))
        members = vb.model(xq)[..., 0]
        sd, mu = vb.outcome_transform.stdvs.squeeze(), vb.outcome_transform.means.squeeze()
        self.assertTrue(
            torch.allclose(vb.posterior(xq.unsqueeze(0)).values[..., 0], members * sd + mu)
        )

    def test_thompson_sampling_picks_a_member_maximum(self):
        model = vboot_rff(torch.float64)
        cands = torch.rand(50, D, dtype=torch.float64)
        torch.manual_seed(5)
        picked = MaxPosteriorSampling(model, replacement=True)(cands, num_samples=4)
        members = model.posterior(cands).values[..., 0]  # (K, 50)
        maxima = {tuple(cands[i].tolist()) for i in members.argmax(-1).tolist()}
        for row in picked:
            self.assertIn(tuple(row.tolist()), maxima)

    def test_errors(self):
        model = weight_ensemble(torch.float64, "swag")
        with pytest.raises(InputTypeError, match="dtype"):
            model.posterior(torch.rand(2, 1, D, dtype=torch.float32))
        with pytest.raises(ShapeError, match="columns"):
            model.posterior(torch.rand(2, 1, D + 2, dtype=torch.float64))
        with pytest.raises(InputDataError, match="output_indices"):
            model.posterior(torch.rand(2, 1, D, dtype=torch.float64), output_indices=[1])
        with pytest.raises(InputDataError, match="classifier"):
            model.class_probabilities(torch.rand(2, 1, D, dtype=torch.float64))
        with pytest.raises(ShapeError, match="S >= 2"):
            WeightEnsembleSurrogate(model.model, model.sample_weights[:1])
        with pytest.raises(ShapeError, match=r"shape \(S,"):
            WeightEnsembleSurrogate(model.model, model.sample_weights[:, :-1])
        with pytest.raises(InputTypeError, match="SWAG or MultiSWAG"):
            WeightEnsembleSurrogate.from_swag(model.model, object(), 3)
        with pytest.raises(InputTypeError, match="VBootRFF or VBootMLP"):
            VBootSurrogate(torch.nn.Linear(2, 1))
        with pytest.raises(NotFittedError, match="fit the VBoot"):
            VBootSurrogate(VBootRFF(num_features=10), input_dim=D).posterior(torch.rand(1, 1, D))
        with pytest.raises(NotFittedError, match="fit_weight_ensemble|class methods"):
            x, y, _ = data(torch.float64)
            m = WeightEnsembleSurrogate(model.model, model.sample_weights)
            m.train_X, m.train_Y = x, y
            fit_gpext_surrogate(m)
        x, y, _ = data(torch.float64)
        with pytest.raises(InputDataError, match="method"):
            fit_weight_ensemble(x, y, method="laplace")
        with pytest.raises(InputDataError, match="swa_epochs"):
            fit_weight_ensemble(x, y, epochs=5, swa_epochs=5)
        with pytest.raises(ShapeError, match=r"\(n, 1\)"):
            fit_weight_ensemble(x, y.squeeze(-1))


def test_fit_weight_ensemble_chooses_the_temperature_on_a_hold_out(monkeypatch):
    """From 200 rows the pca methods train on 90% and pick T on the other 10%."""
    from gpext.subspace import SubspaceModel

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(220, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * x[:, :1]) + 0.1 * torch.randn(220, 1, generator=gen, dtype=torch.float64)
    seen = {}
    original = SubspaceModel.select_temperature

    def spy(self, xt, yt, xv, yv, *args, **kwargs):
        seen["rows"] = (xt.shape[0], xv.shape[0])
        out = original(self, xt, yt, xv, yv, *args, **kwargs)
        seen["scores"] = out[2]
        return out

    monkeypatch.setattr(SubspaceModel, "select_temperature", spy)
    model = fit_weight_ensemble(
        x, y, method="pca_ess", num_samples=4, hidden_features=(8,), epochs=8, swa_epochs=4,
        rank=3, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert seen["rows"] == (198, 22)
    assert len(seen["scores"]) == 7 and model.sample_weights.shape[0] == 4
    seen.clear()
    fit_weight_ensemble(
        x, y, method="pca_ess", num_samples=4, hidden_features=(8,), epochs=8, swa_epochs=4,
        rank=3, validation_fraction=0.0, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    assert not seen
    with pytest.raises(InputDataError, match="validation_fraction"):
        fit_weight_ensemble(x, y, method="pca_ess", validation_fraction=0.9)
