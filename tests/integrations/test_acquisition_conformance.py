"""LogEI, qLogNEI, qUCB and optimize_acqf run on every adapter, in float32 and float64."""

from __future__ import annotations

import torch
from _botorch_fixtures import D, all_classifiers, all_regression, data
from botorch.acquisition import (
    LogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.acquisition.objective import LinearMCObjective, ScalarizedPosteriorTransform
from botorch.optim import optimize_acqf
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.sampling.index_sampler import IndexSampler
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.testing import BotorchTestCase

DTYPES = (torch.float32, torch.float64)


def _acqfs(model, x_base, best_f, dtype):
    """The three acquisition functions with the BoTorch sampler that fits the posterior type."""
    kw = {}
    if model.num_outputs > 1:  # classifiers: optimise the latent difference f_1 - f_0
        w = torch.tensor([-1.0, 1.0], dtype=dtype)
        kw_analytic = {"posterior_transform": ScalarizedPosteriorTransform(w)}
        kw = {"objective": LinearMCObjective(w)}
    else:
        kw_analytic = {}
    probe = model.posterior(x_base[:1].unsqueeze(0))
    if isinstance(probe, EnsemblePosterior):
        sampler = IndexSampler(torch.Size([16]), seed=0)
    else:
        sampler = SobolQMCNormalSampler(torch.Size([16]), seed=0)
    out = {}
    if not (isinstance(probe, EnsemblePosterior) and model.num_outputs > 1):
        out["LogEI"] = LogExpectedImprovement(model, best_f=best_f, **kw_analytic)
    out["qLogNEI"] = qLogNoisyExpectedImprovement(
        model, X_baseline=x_base, sampler=sampler, cache_root=False, **kw
    )
    out["qUCB"] = qUpperConfidenceBound(model, beta=2.0, sampler=sampler, **kw)
    return out


class TestAcquisitionConformance(BotorchTestCase):
    def test_acquisition_functions_and_optimize_acqf(self):
        for dtype in DTYPES:
            x, y, _ = data(dtype)
            bounds = torch.stack([torch.zeros(D, dtype=dtype), torch.ones(D, dtype=dtype)])
            models = {**all_regression(dtype), **all_classifiers(dtype)}
            for name, model in models.items():
                acqfs = _acqfs(model, x[:6], float(y.max()), dtype)
                for acq_name, acqf in acqfs.items():
                    q = 1 if acq_name == "LogEI" else 2
                    X = torch.rand(3, q, D, dtype=dtype, requires_grad=True)
                    val = acqf(X)
                    msg = f"{name} / {acq_name} / {dtype}"
                    self.assertEqual(val.shape, torch.Size([3]), msg)
                    self.assertTrue(bool(torch.isfinite(val).all()), msg)
                    val.sum().backward()
                    self.assertIsNotNone(X.grad, msg)
                    self.assertTrue(bool(torch.isfinite(X.grad).all()), msg)
                # optimize_acqf with the cheapest settings on the MC acquisition function
                cand, value = optimize_acqf(
                    acqfs["qUCB"], bounds, q=2, num_restarts=2, raw_samples=16,
                    options={"maxiter": 5},
                )  # fmt: skip
                self.assertEqual(cand.shape, torch.Size([2, D]), name)
                self.assertTrue(bool(((cand >= 0) & (cand <= 1)).all()), name)
                self.assertTrue(bool(torch.isfinite(value).all()), name)
            # analytic LogEI with optimize_acqf on one GP adapter and one ensemble per dtype
            for name in ("ign", "vboot_rff"):
                acqf = LogExpectedImprovement(models[name], best_f=float(y.max()))
                cand, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=2, raw_samples=16,
                                        options={"maxiter": 5})  # fmt: skip
                self.assertEqual(cand.shape, torch.Size([1, D]))

    def test_ucb_prefers_high_mean_where_members_agree(self):
        """qUCB on an ensemble is the member average plus the beta-scaled member spread."""
        model = all_regression(torch.float64)["vboot_rff"]
        X = torch.rand(5, 1, D, dtype=torch.float64)
        acqf = qUpperConfidenceBound(
            model, beta=4.0, sampler=IndexSampler(torch.Size([64]), seed=0)
        )
        vals = acqf(X)
        values = model.posterior(X).values[..., 0, 0]  # (5, K)
        idx = acqf.get_posterior_samples(model.posterior(X)).shape
        self.assertEqual(idx[0], 64)
        # every qUCB value lies between the member mean and the largest member value plus slack
        mean = values.mean(-1)
        self.assertTrue(bool((vals >= mean - 1e-9).all()))
        self.assertTrue(
            bool(
                (vals <= mean + (2.0 * (values - mean[:, None]).abs().max(-1).values) + 1e-9).all()
            )
        )
