"""The BoTorch adapters on a CUDA device (skipped without one).

Every adapter is built the way a user on a GPU builds it: training data on the device (and, for
the adapters that wrap a user-made module, the module moved there first), fitted there with its
defaults on a small design, then used by BoTorch: posteriors with and without observation noise,
scalarisation, fantasies, LogEI / qLogNEI under ``optimize_acqf``, pathwise Thompson sampling,
look-ahead acquisitions on the GP adapters and the feasibility wrapper.  Besides, an adapter
fitted on the CPU and moved with ``.to("cuda")`` predicts what it predicted on the CPU (every
tensor the posterior needs is a parameter or buffer).  Both float32 and float64.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("botorch")

from _botorch_fixtures import D, feasible, objective  # noqa: E402
from botorch.acquisition import (  # noqa: E402
    LogExpectedImprovement,
    qKnowledgeGradient,
    qLogNoisyExpectedImprovement,
)
from botorch.acquisition.objective import ScalarizedPosteriorTransform  # noqa: E402
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling  # noqa: E402
from botorch.models.transforms.outcome import Standardize  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402

from gpext.bootstrap import VBootMLP, VBootRFF  # noqa: E402
from gpext.integrations.botorch import (  # noqa: E402
    DirichletClassifierSurrogate,
    FeasibilityWeightedAcquisition,
    GWISurrogate,
    IGNSurrogate,
    VBootSurrogate,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.models import DirichletGPClassifier, GWIRegressionModel, InducingGPNetwork  # noqa: E402
from gpext.nn import MLP  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 20
DTYPES = [torch.float32, torch.float64]
REGRESSION = [
    "vboot_rff",
    "vboot_mlp",
    "ign",
    "gwi",
    "swag",
    "multiswag",
    "pca_ess",
    "pca_vi",
    "last_layer",
]
GP_BASED = ["ign", "gwi"]


def data(device: str, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, D, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    return x, objective(x), feasible(x)


def build(name: str, device: str, dtype: torch.dtype):
    """A fitted regression adapter on ``device`` (small but default settings)."""
    x, y, _ = data(device, dtype)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "vboot_rff":
        model = VBootSurrogate(
            VBootRFF(num_features=64, num_particles=8),
            train_X=x,
            train_Y=y,
            outcome_transform=Standardize(1),
        )
        return fit_gpext_surrogate(model, generator=g)
    if name == "vboot_mlp":
        vb = VBootMLP(4, hidden_sizes=(8,), dtype=dtype)
        model = VBootSurrogate(vb, train_X=x, train_Y=y, outcome_transform=Standardize(1))
        return fit_gpext_surrogate(model, num_epochs=5, batch_size=10)
    if name == "ign":
        net = InducingGPNetwork(MLP(D, [8], 3), num_inducing=6).to(device=device, dtype=dtype)
        model = IGNSurrogate(net, train_X=x, train_Y=y, outcome_transform=Standardize(1))
        return fit_gpext_surrogate(model, epochs=5, batch_size=10, generator=g)
    if name == "gwi":
        m, lik = GWIRegressionModel.from_data(x, y.squeeze(-1), prior_steps=5, generator=g)
        model = GWISurrogate(m, lik, train_X=x, train_Y=y)
        return fit_gpext_surrogate(model, epochs=3, batch_size=10, generator=g)
    return fit_weight_ensemble(
        x, y, method=name, num_samples=4, hidden_features=(8,), epochs=10, swa_epochs=5,
        rank=2, generator=g, outcome_transform=Standardize(1),
    )  # fmt: skip


def bounds(device, dtype):
    return torch.tensor([[0.0] * D, [1.0] * D], device=device, dtype=dtype)


def on_cuda_and_finite(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and bool(torch.isfinite(t).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", REGRESSION)
def test_regression_adapter_on_cuda(name, dtype):
    model = build(name, "cuda", dtype)
    x, y, _ = data("cuda", dtype)
    X = torch.rand(5, D, device="cuda", dtype=dtype)
    post = model.posterior(X)
    assert on_cuda_and_finite(post.mean) and on_cuda_and_finite(post.variance)
    assert post.mean.dtype == dtype and post.mean.shape == (5, 1)
    noisy = model.posterior(X, observation_noise=True)
    assert bool((noisy.variance >= post.variance * (1 - 1e-4)).all())
    w = torch.tensor([2.0], device="cuda", dtype=dtype)
    scal = model.posterior(X, posterior_transform=ScalarizedPosteriorTransform(w))
    assert on_cuda_and_finite(scal.mean)
    torch.testing.assert_close(scal.mean, 2 * post.mean, rtol=1e-4, atol=1e-5)

    sampler = SobolQMCNormalSampler(torch.Size([2]), seed=0)
    fant = model.fantasize(X[:2], sampler=sampler)
    fpost = fant.posterior(X)
    assert on_cuda_and_finite(fpost.mean) and fpost.mean.shape[0] == 2

    ei = LogExpectedImprovement(model, best_f=y.max())
    cand, val = optimize_acqf(
        ei, bounds("cuda", dtype), q=1, num_restarts=2, raw_samples=16, options={"maxiter": 10}
    )
    assert on_cuda_and_finite(cand) and cand.shape == (1, D)
    nei = qLogNoisyExpectedImprovement(model, X_baseline=x, cache_root=False)
    cand, _ = optimize_acqf(
        nei, bounds("cuda", dtype), q=2, num_restarts=2, raw_samples=16, options={"maxiter": 5}
    )
    assert on_cuda_and_finite(cand) and cand.shape == (2, D)
    ts = PathwiseThompsonSampling(model)
    with torch.no_grad():
        draw = ts(X.unsqueeze(-2))
    assert on_cuda_and_finite(draw) and draw.shape == (5,)
    if name in GP_BASED:
        kg = qKnowledgeGradient(model, num_fantasies=4)
        cand, _ = optimize_acqf(
            kg, bounds("cuda", dtype), q=1, num_restarts=2, raw_samples=16, options={"maxiter": 5}
        )
        assert on_cuda_and_finite(cand)


@pytest.mark.parametrize("name", REGRESSION)
def test_moved_to_cuda_predicts_as_on_the_cpu(name):
    dtype = torch.float64
    model = build(name, "cpu", dtype)
    X = torch.rand(6, D, dtype=dtype, generator=torch.Generator().manual_seed(3))
    model.eval()
    with torch.no_grad():
        cpu = model.posterior(X)
        mean, var = cpu.mean.clone(), cpu.variance.clone()
        model.to("cuda")
        gpu = model.posterior(X.cuda())
        assert gpu.mean.device.type == "cuda"
        torch.testing.assert_close(gpu.mean.cpu(), mean, rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(gpu.variance.cpu(), var, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_feasibility_weighted_acquisition_on_cuda(dtype):
    x, y, c = data("cuda", dtype)
    objective_model = build("vboot_rff", "cuda", dtype)
    clf = DirichletClassifierSurrogate(DirichletGPClassifier(2), train_X=x, train_Y=c)
    clf = fit_gpext_surrogate(clf, max_iter=10, generator=torch.Generator().manual_seed(0))
    p = clf.posterior(torch.rand(4, D, device="cuda", dtype=dtype))
    assert on_cuda_and_finite(p.mean)
    best = y[c.bool()].max()
    acqf = FeasibilityWeightedAcquisition(LogExpectedImprovement(objective_model, best), clf)
    cand, val = optimize_acqf(
        acqf, bounds("cuda", dtype), q=1, num_restarts=2, raw_samples=16, options={"maxiter": 10}
    )
    assert on_cuda_and_finite(cand) and on_cuda_and_finite(val)
    nei = qLogNoisyExpectedImprovement(objective_model, X_baseline=x, cache_root=False)
    acqf = FeasibilityWeightedAcquisition(nei, clf)
    cand, _ = optimize_acqf(
        acqf, bounds("cuda", dtype), q=2, num_restarts=2, raw_samples=16,
        options={"maxiter": 5}, sequential=True,
    )  # fmt: skip
    assert on_cuda_and_finite(cand) and cand.shape == (2, D)
