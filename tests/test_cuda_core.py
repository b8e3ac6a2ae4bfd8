"""The core models, kernels and operators on a CUDA device (skipped without one).

Each object is built and fitted the way its docstring example does, with the data on the GPU
(and the module moved there where the user makes it), and checked against the same computation
on the CPU where that computation is deterministic.  ``GPEXT_TEST_DEVICE=cpu`` runs the same
tests on the CPU (to check the tests themselves on a machine without a GPU).
"""

from __future__ import annotations

import os

import gpytorch
import pytest
import torch

from gpext.bootstrap import EnsembleMLP, VBootMLP, VBootRFF
from gpext.fit import build_exact_gp, fit_exact_gp
from gpext.kernels import (
    FeatureMapKernel,
    NeuralTangentKernel,
    NystromKPCAKernel,
    RandomFourierFeaturesKernel,
)
from gpext.models import GWIClassificationModel, InducingGPNetwork
from gpext.nn import MLP
from gpext.operators import IncrementalKPCA
from gpext.subspace import InKPCASubspace, OnlineFactorAnalysis

DEVICE = os.environ.get("GPEXT_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
)


def on_device(t: torch.Tensor) -> bool:
    return t.device.type == torch.device(DEVICE).type and bool(torch.isfinite(t).all())


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_incremental_kpca_matches_the_cpu():
    x, q = randn(40, 3), randn(4, 3, seed=1)
    out = {}
    for device in ("cpu", DEVICE):
        kernel = gpytorch.kernels.RBFKernel().double().to(device)
        kpca = IncrementalKPCA(kernel, centered=True, device=device)
        for chunk in x.to(device).split(10):
            kpca.update(chunk)
        scores = kpca.transform(q.to(device), num_components=3)
        assert scores.device.type == torch.device(device).type
        out[device] = (kpca.eigenvalues.cpu(), scores.abs().cpu())
    torch.testing.assert_close(out[DEVICE][0], out["cpu"][0], rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(out[DEVICE][1], out["cpu"][1], rtol=1e-6, atol=1e-8)


def test_nystrom_kpca_kernel_matches_the_cpu():
    landmarks, x, new = randn(20, 2, dtype=torch.float32), randn(30, 2, seed=1), randn(5, 2, seed=2)
    out = {}
    for device in ("cpu", DEVICE):
        base = gpytorch.kernels.RBFKernel()
        kernel = gpytorch.kernels.ScaleKernel(NystromKPCAKernel(base, landmarks.to(device)))
        kernel = kernel.to(device)
        kernel.base_kernel.update(new.float().to(device))
        covar = kernel(x.float().to(device)).to_dense()
        assert covar.device.type == torch.device(device).type
        out[device] = covar.detach().cpu()
    torch.testing.assert_close(out[DEVICE], out["cpu"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_feature_kernels_match_the_cpu(dtype):
    x = randn(12, 3, dtype=dtype)
    kernels = {
        "rff": lambda: RandomFourierFeaturesKernel(
            64, base="matern52", ard_num_dims=3, generator=torch.Generator().manual_seed(0)
        ),
        "ntk": lambda: NeuralTangentKernel(num_layers=2, kind="ntk"),
        "feature_map": lambda: FeatureMapKernel(MLP(3, [16], 4)),
    }
    for name, make in kernels.items():
        torch.manual_seed(0)
        kernel = make().to(dtype)
        cpu = kernel(x).to_dense().detach()
        kernel = kernel.to(DEVICE)
        dev = kernel(x.to(DEVICE)).to_dense().detach()
        diag = kernel(x.to(DEVICE), diag=True).detach()
        assert on_device(dev) and on_device(diag), name
        tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
        torch.testing.assert_close(dev.cpu(), cpu, **tol, msg=name)
        torch.testing.assert_close(diag.cpu(), cpu.diagonal(), **tol, msg=name)


def test_inducing_gp_network_fits_on_the_device():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 3, generator=g)
    y = x[:, 0].sin() + 0.1 * torch.randn(120, generator=g)
    model = InducingGPNetwork(MLP(3, [32], 4), num_inducing=16).to(DEVICE)
    model.fit(x.to(DEVICE), y.to(DEVICE), epochs=3, batch_size=40)
    mean, var = model.predict(x[:5].to(DEVICE))
    assert on_device(mean) and on_device(var) and bool((var > 0).all())


def test_gwi_classification_on_the_device():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    x, y = x.to(DEVICE), y.to(DEVICE)
    model, likelihood = GWIClassificationModel.from_data(x, y, num_classes=3, generator=g)
    model.fit(likelihood, x, y, epochs=3)
    probs = model.predict_proba(likelihood, x[:5])
    assert on_device(probs) and probs.shape == (5, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, device=probs.device, dtype=probs.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_vboot_on_the_device(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 2, generator=g, dtype=dtype).to(DEVICE)
    labels = (x[:, 0] > 0).long()
    clf = VBootRFF(num_features=64, num_particles=8, task="classification", num_classes=2)
    clf.fit(x, labels, generator=torch.Generator().manual_seed(0))
    probs = clf.predict_proba(x[:5])
    assert on_device(probs) and probs.shape == (5, 2)
    reg = VBootMLP(4, hidden_sizes=(16,), dtype=dtype)
    reg.fit(x, torch.sin(3 * x[:, :1]), num_epochs=3, batch_size=40)
    out = reg(x[:5])
    assert on_device(out) and out.shape[:2] == (4, 5)
    net = EnsembleMLP(4, in_features=2, out_features=2, hidden_sizes=(8,)).to(DEVICE, dtype)
    assert on_device(net(x[:5]))


def test_online_factor_analysis_and_inkpca_subspace_on_the_device():
    data = randn(300, 12)
    out = {}
    for device in ("cpu", DEVICE):
        fa = OnlineFactorAnalysis(
            dim=12, latent_dim=2, device=device, generator=torch.Generator().manual_seed(0)
        )
        fa.update(data.to(device))
        cov = fa.covariance().to_dense()
        assert cov.device.type == torch.device(device).type
        out[device] = cov.cpu()
    torch.testing.assert_close(out[DEVICE], out["cpu"], rtol=1e-6, atol=1e-8)
    sub = InKPCASubspace(rank=2)
    for d in randn(10, 50, seed=3).to(DEVICE):
        sub.update(d)
    assert on_device(sub.projection) and sub.projection.shape == (2, 50)


def test_fit_exact_gp_on_the_device():
    x = torch.rand(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x = x.to(DEVICE)
    model = build_exact_gp(x, torch.sin(6 * x[:, 0]))
    res = fit_exact_gp(model, num_restarts=2)
    assert res.stop_reason.value == "converged"
    model.eval()
    with torch.no_grad():
        pred = model(x[:4])
    assert on_device(pred.mean)


def test_small_table_gwi_refit_and_reference_check_on_the_device():
    # below 200 rows: the refit copy (restarted from its own rows), its early stopping, the
    # temperature and the held-out checks with the exact-GP reference, all on the device
    from gpext.fit import reference_heldout_nll
    from gpext.models import GWIRegressionModel
    from gpext.subspace import check_mixture_heldout, select_mixture_variance_scale

    g = torch.Generator().manual_seed(0)
    x = torch.rand(80, 2, generator=g, dtype=torch.float64)
    y = torch.sin(5 * x[:, 0]) + 0.2 * torch.randn(80, generator=g, dtype=torch.float64)
    x, y = x.to(DEVICE), y.to(DEVICE)
    model, lik = GWIRegressionModel.from_data(x[:60], y[:60], num_inducing=16, prior_steps=20,
                                              generator=g)  # fmt: skip
    model.fit(lik, x[:60], y[:60], epochs=50, generator=g)
    assert model.temperature_calibration_["method"] == "refit"
    assert model.heldout_check_.num_points == 12
    mean, var = model.predict(lik, x[60:])
    assert on_device(mean) and on_device(var)
    ref = reference_heldout_nll(x[:60], y[:60], x[60:], y[60:])
    cpu = reference_heldout_nll(x[:60].cpu(), y[:60].cpu(), x[60:].cpu(), y[60:].cpu())
    assert ref is not None and abs(ref - cpu) < 1e-3
    means = mean.unsqueeze(0) + 0.01 * randn(8, 20).to(DEVICE)
    kappa, _ = select_mixture_variance_scale(means, var.expand(8, -1), y[60:])
    check = check_mixture_heldout(means, var.expand(8, -1), y[60:], variance_scale=kappa,
                                  reference_nll=ref)  # fmt: skip
    assert check.num_points == 20
