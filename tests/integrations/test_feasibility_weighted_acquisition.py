"""A gpext classifier as the feasibility model of constrained Bayesian optimisation."""

from __future__ import annotations

import pytest
import torch
from _botorch_fixtures import D, all_classifiers, data, feasible, ign
from botorch.acquisition import LogExpectedImprovement, qUpperConfidenceBound
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.testing import BotorchTestCase

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.integrations.botorch import FeasibilityWeightedAcquisition

DTYPES = (torch.float32, torch.float64)


class TestFeasibilityWeightedAcquisition(BotorchTestCase):
    def test_values_are_weighted_by_class_probability(self):
        for dtype in DTYPES:
            objective_model = ign(dtype)
            _, y, _ = data(dtype)
            base = LogExpectedImprovement(objective_model, best_f=float(y.max()))
            X = torch.rand(6, 1, D, dtype=dtype)
            for name, clf in all_classifiers(dtype).items():
                acqf = FeasibilityWeightedAcquisition(base, clf, feasible_class=1)
                self.assertTrue(acqf.log)
                p = clf.class_probabilities(X)[..., 1]
                self.assertTrue(bool(((p >= 0) & (p <= 1)).all()), name)
                expected = base(X) + p.clamp_min(1e-12).log().sum(-1)
                self.assertTrue(torch.allclose(acqf(X), expected), name)
            ucb = qUpperConfidenceBound(objective_model, beta=1.0,
                                        sampler=SobolQMCNormalSampler(torch.Size([8]), seed=0))  # fmt: skip
            clf = all_classifiers(dtype)["dirichlet"]
            # qUCB can be negative: weighted as a0 + P (ucb - a0) with a0 a lower bound of qUCB
            weighted = FeasibilityWeightedAcquisition(ucb, clf, infeasible_value=-10.0)
            self.assertFalse(weighted.log)
            Xq = torch.rand(4, 2, D, dtype=dtype)
            P = clf.class_probabilities(Xq)[..., 1].prod(-1)
            expected = -10.0 + P * (ucb(Xq) + 10.0)
            self.assertTrue(torch.allclose(weighted(Xq), expected, rtol=1e-5))

    def test_analytic_base_with_q_2_is_a_shape_error(self):
        """Issue 40 fuzz: BoTorch's bare AssertionError (expected_q=1) before."""
        dtype = torch.float64
        _, y, _ = data(dtype)
        base = LogExpectedImprovement(ign(dtype), best_f=float(y.max()))
        acqf = FeasibilityWeightedAcquisition(base, all_classifiers(dtype)["dirichlet"])
        with self.assertRaisesRegex(ShapeError, "q = 1 point per batch"):
            acqf(torch.rand(3, 2, D, dtype=dtype))
        self.assertEqual(acqf(torch.rand(3, 1, D, dtype=dtype)).shape, (3,))

    def test_classifiers_separate_feasible_region(self):
        """On held-out points, predicted feasibility is higher where the constraint holds."""
        x = torch.rand(200, D, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
        ok = feasible(x).squeeze(-1).bool()
        for name, clf in all_classifiers(torch.float64).items():
            p = clf.class_probabilities(x.unsqueeze(-2))[..., 0, 1]
            self.assertGreater(float(p[ok].mean()), float(p[~ok].mean()) + 0.1, name)

    def test_optimize_constrained_candidate(self):
        dtype = torch.float64
        _, y, c = data(dtype)
        best_feasible = float(y[c.bool()].max())
        base = LogExpectedImprovement(ign(dtype), best_f=best_feasible)
        acqf = FeasibilityWeightedAcquisition(base, all_classifiers(dtype)["dirichlet"])
        bounds = torch.stack([torch.zeros(D, dtype=dtype), torch.ones(D, dtype=dtype)])
        cand, value = optimize_acqf(acqf, bounds, q=1, num_restarts=2, raw_samples=32,
                                    options={"maxiter": 10})  # fmt: skip
        self.assertEqual(cand.shape, torch.Size([1, D]))
        self.assertTrue(bool(torch.isfinite(value)))

    def test_errors(self):
        dtype = torch.float64
        base = LogExpectedImprovement(ign(dtype), best_f=0.0)
        clf = all_classifiers(dtype)["dirichlet"]
        with pytest.raises(InputTypeError, match="AcquisitionFunction"):
            FeasibilityWeightedAcquisition(lambda x: x, clf)
        with pytest.raises(InputTypeError, match="classifier adapter"):
            FeasibilityWeightedAcquisition(base, object())
        with pytest.raises(InputDataError, match="feasible_class"):
            FeasibilityWeightedAcquisition(base, clf, feasible_class=-1)
        with pytest.raises(InputDataError, match="min_probability"):
            FeasibilityWeightedAcquisition(base, clf, min_probability=0.0)
        acqf = FeasibilityWeightedAcquisition(base, clf, feasible_class=5)
        with pytest.raises(InputDataError, match=r"index in \[0, 2\)"):
            acqf(torch.rand(2, 1, D, dtype=dtype))
        with pytest.raises(InputDataError, match="classifier"):
            FeasibilityWeightedAcquisition(base, ign(dtype))(torch.rand(2, 1, D, dtype=dtype))
