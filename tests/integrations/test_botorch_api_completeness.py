"""BoTorch Model / acquisition API completeness (issue 17, items 2 and 4).

* :class:`FeasibilityWeightedAcquisition` is correct for acquisitions of any sign, reads the base
  acquisition's ``_log`` and forwards pending points (``optimize_acqf(..., sequential=True)``);
* ``posterior_transform=ScalarizedPosteriorTransform(...)`` works on every adapter (the ensembles
  push the transform through every member);
* ``subset_output`` on the ensemble and latent-GP adapters.
"""

from __future__ import annotations

import functools

import pytest
import torch
from _botorch_fixtures import (
    D,
    data,
    dirichlet,
    gwi,
    ign,
    objective,
    vboot_mlp,
    vboot_rff,
    weight_ensemble,
)
from botorch.acquisition import (
    LogExpectedImprovement,
    PosteriorMean,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.acquisition.objective import GenericMCObjective, ScalarizedPosteriorTransform
from botorch.acquisition.utils import get_infeasible_cost
from botorch.models.deterministic import GenericDeterministicModel
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.testing import BotorchTestCase

from gpext.bootstrap import VBootRFF
from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.integrations.botorch import (
    FeasibilityWeightedAcquisition,
    VBootSurrogate,
    fit_gpext_surrogate,
)

DTYPES = (torch.float32, torch.float64)
SHIFT = 10.0  # the "negative objective" is x_0 + x_1 - SHIFT on [0, 1]^2 (all negative)


def grid(dtype: torch.dtype, n: int = 41) -> torch.Tensor:
    """An ``n x n`` grid of [0, 1]^2 as ``n^2 x 1 x 2`` candidates."""
    t = torch.linspace(0, 1, n, dtype=dtype)
    return torch.stack(torch.meshgrid(t, t, indexing="ij"), -1).reshape(-1, 1, D)


def bounds(dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([torch.zeros(D, dtype=dtype), torch.ones(D, dtype=dtype)])


def p_feasible(clf, X: torch.Tensor) -> torch.Tensor:
    """Classifier probability of class 1 (feasible) at ``(..., d)`` points. # shape: (...)"""
    with torch.no_grad():
        return clf.class_probabilities(X.unsqueeze(-2))[..., 0, 1]


@functools.cache
def vboot_two_outputs(dtype: torch.dtype) -> VBootSurrogate:
    """A VBoot-RFF ensemble of a two-output regression, with ``Standardize(2)``."""
    x, y, _ = data(dtype)
    y2 = torch.cat([y, 5.0 * x[:, 1:] ** 2 - 3.0], dim=-1)
    vb = VBootRFF(num_features=40, num_particles=8, lengthscale=0.3, outputscale=1.0, noise=1e-2)
    model = VBootSurrogate(vb, train_X=x, train_Y=y2, outcome_transform=Standardize(2))
    return fit_gpext_surrogate(model, generator=torch.Generator().manual_seed(0))


def ensemble_adapters(dtype: torch.dtype) -> dict:
    out = {
        m: weight_ensemble(dtype, m)
        for m in ("swag", "multiswag", "pca_ess", "pca_vi", "last_layer")
    }
    out.update(
        vboot_rff=vboot_rff(dtype),
        vboot_mlp=vboot_mlp(dtype),
        vboot_rff_clf=vboot_rff(dtype, classification=True),  # two logits
        vboot_two_outputs=vboot_two_outputs(dtype),
    )
    return out


def latent_adapters(dtype: torch.dtype) -> dict:
    return {"ign": ign(dtype), "gwi": gwi(dtype), "dirichlet": dirichlet(dtype)}  # m = 1, 1, 2


class LogNamedPosteriorMean(PosteriorMean):
    """A non-log acquisition whose class name starts with ``Log`` (``_log`` is False)."""


class MyExpectedImprovement(LogExpectedImprovement):
    """A log acquisition whose class name does not start with ``Log`` (``_log`` is True)."""


class TestFeasibilityWeightedAcquisitionAnySign(BotorchTestCase):
    def test_negative_acquisition_prefers_feasible_points(self):
        """PosteriorMean of an all-negative objective whose maximum is infeasible."""
        for dtype in DTYPES:
            clf = dirichlet(dtype)
            model = GenericDeterministicModel(lambda X: X.sum(-1, keepdim=True) - SHIFT)
            base = PosteriorMean(model)
            X = grid(dtype)
            p = p_feasible(clf, X[:, 0])
            # the naive product alpha * P prefers the least feasible points (value ~ -0)
            naive = (base(X) * p).detach()
            self.assertLess(float(p[naive.argmax()]), 0.1)
            # default infeasible_value 0 is not a lower bound here: a clear error
            with pytest.raises(InputDataError, match="infeasible_value"):
                FeasibilityWeightedAcquisition(base, clf)(X)
            acqf = FeasibilityWeightedAcquisition(base, clf, infeasible_value=-SHIFT)
            self.assertFalse(acqf.log)
            values = acqf(X)
            P = clf.class_probabilities(X)[..., 1].prod(-1)
            expected = -SHIFT + P * (base(X) + SHIFT)
            self.assertTrue(torch.allclose(values, expected))
            self.assertGreater(float(p[values.argmax()]), 0.8)
            torch.manual_seed(0)
            cand, _ = optimize_acqf(acqf, bounds(dtype), q=1, num_restarts=2, raw_samples=64,
                                    options={"maxiter": 30})  # fmt: skip
            self.assertGreater(float(p_feasible(clf, cand)), 0.8)
            # the chosen point is also good for the objective: near the boundary x0 + x1 = 1
            self.assertGreater(float(cand.sum()), 0.8)

    def test_qucb_on_negative_objective_with_infeasible_cost(self):
        """qUCB of a negative MC objective, ``infeasible_value`` from BoTorch's infeasible cost."""
        dtype = torch.float64
        clf, model = dirichlet(dtype), ign(dtype)
        X = grid(dtype, 21)
        shifted = GenericMCObjective(lambda Y, X=None: Y[..., 0] - SHIFT)
        lower = -get_infeasible_cost(X[:, 0], model, objective=shifted)
        sampler = SobolQMCNormalSampler(torch.Size([64]), seed=0)
        base = qUpperConfidenceBound(model, beta=1.0, objective=shifted, sampler=sampler)
        self.assertTrue(bool((base(X) < 0).all()))
        acqf = FeasibilityWeightedAcquisition(base, clf, infeasible_value=lower.item())
        p = p_feasible(clf, X[:, 0])
        self.assertLess(float(p[(base(X) * p).argmax()]), 0.1)  # the naive product
        self.assertGreater(float(p[acqf(X).argmax()]), 0.8)
        torch.manual_seed(0)
        cand, _ = optimize_acqf(acqf, bounds(dtype), q=2, num_restarts=2, raw_samples=32,
                                options={"maxiter": 20}, sequential=True)  # fmt: skip
        self.assertTrue(bool((p_feasible(clf, cand) > 0.5).all()))

    def test_log_mode_is_read_from_the_log_attribute(self):
        for dtype in DTYPES:
            x, y, _ = data(dtype)
            model, clf = ign(dtype), dirichlet(dtype)
            Xq = torch.rand(5, 1, D, dtype=dtype)
            logP = clf.class_probabilities(Xq)[..., 1].clamp_min(1e-12).log().sum(-1)
            for base in (
                LogExpectedImprovement(model, best_f=float(y.max())),
                MyExpectedImprovement(model, best_f=float(y.max())),
                qLogNoisyExpectedImprovement(
                    model, X_baseline=x, sampler=SobolQMCNormalSampler(torch.Size([16]), seed=0)
                ),
            ):
                acqf = FeasibilityWeightedAcquisition(base, clf)
                self.assertTrue(acqf.log)
                self.assertTrue(acqf._log)
                self.assertTrue(torch.allclose(acqf(Xq), base(Xq) + logP))
                with pytest.raises(InputDataError, match="log acquisition"):
                    FeasibilityWeightedAcquisition(base, clf, infeasible_value=-1.0)
            base = LogNamedPosteriorMean(GenericDeterministicModel(lambda X: X.sum(-1, True) + 1))
            acqf = FeasibilityWeightedAcquisition(base, clf)
            self.assertFalse(acqf.log)
            self.assertTrue(torch.allclose(acqf(Xq), base(Xq) * logP.exp()))

    def test_sequential_q3_forwards_pending_points(self):
        dtype = torch.float64
        x, _, _ = data(dtype)
        clf = dirichlet(dtype)
        inner = qLogNoisyExpectedImprovement(
            ign(dtype), X_baseline=x, sampler=SobolQMCNormalSampler(torch.Size([32]), seed=0)
        )
        acqf = FeasibilityWeightedAcquisition(inner, clf)
        # explicit pending points reach the base acquisition and change its value
        Xq = torch.rand(4, 1, D, dtype=dtype)
        before = acqf(Xq).detach()
        pending = torch.tensor([[0.2, 0.3], [0.4, 0.1]], dtype=dtype)
        acqf.set_X_pending(pending)
        logP = clf.class_probabilities(Xq)[..., 1].clamp_min(1e-12).log().sum(-1)
        self.assertTrue(torch.allclose(acqf(Xq), inner(Xq) + logP))
        self.assertFalse(torch.allclose(acqf(Xq), before))
        acqf.set_X_pending(None)
        self.assertIsNone(acqf.X_pending)
        self.assertTrue(torch.allclose(acqf(Xq), before))
        # optimize_acqf(sequential=True) passes each chosen point on as pending
        seen = []
        original = inner.set_X_pending

        def spy(X_pending=None):
            seen.append(None if X_pending is None else X_pending.clone())
            original(X_pending)

        inner.set_X_pending = spy
        torch.manual_seed(0)
        cand, _ = optimize_acqf(acqf, bounds(dtype), q=3, num_restarts=2, raw_samples=32,
                                options={"maxiter": 20}, sequential=True)  # fmt: skip
        self.assertEqual(cand.shape, torch.Size([3, D]))
        self.assertEqual([None if s is None else s.shape[0] for s in seen], [1, 2, None])
        self.assertTrue(torch.equal(seen[1], cand[:2]))
        dist = torch.cdist(cand, cand) + torch.eye(3, dtype=dtype)
        self.assertGreater(float(dist.min()), 1e-3)  # three distinct candidates
        self.assertIsNone(acqf.X_pending)

    def test_errors(self):
        dtype = torch.float64
        clf = dirichlet(dtype)
        base = PosteriorMean(GenericDeterministicModel(lambda X: X.sum(-1, keepdim=True)))
        with pytest.raises(InputDataError, match="infeasible_value"):
            FeasibilityWeightedAcquisition(base, clf, infeasible_value=float("nan"))
        with pytest.raises(InputTypeError, match="feasible_class"):
            FeasibilityWeightedAcquisition(base, clf, feasible_class=1.0)
        acqf = FeasibilityWeightedAcquisition(base, clf)
        acqf.set_X_pending(None)  # analytic: nothing to clear, no error
        with pytest.raises(InputTypeError, match="pending points"):
            acqf.set_X_pending(torch.rand(2, D, dtype=dtype))
        with pytest.raises(InputTypeError, match="X_pending"):
            acqf.set_X_pending([[0.1, 0.2]])


class TestScalarizedPosteriorTransform(BotorchTestCase):
    def test_ensembles_push_the_transform_through_every_member(self):
        for dtype in DTYPES:
            X = torch.rand(3, 4, D, dtype=dtype)
            for name, model in ensemble_adapters(dtype).items():
                m = model.num_outputs
                w = torch.tensor([2.0] if m == 1 else [0.5, -2.0], dtype=dtype)
                tf = ScalarizedPosteriorTransform(w, offset=1.5)
                post = model.posterior(X)
                post_t = model.posterior(X, posterior_transform=tf)
                self.assertIsInstance(post_t, EnsemblePosterior, name)
                self.assertEqual(post_t.values.shape, post.values.shape[:-1] + (1,), name)
                self.assertEqual(post_t.mean.shape, torch.Size([3, 4, 1]), name)
                tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
                self.assertTrue(torch.allclose(post_t.mean, post.mean @ w[:, None] + 1.5, **tol))
                members = post.values @ w + 1.5  # shape: (3, S, 4)
                self.assertTrue(torch.allclose(post_t.values[..., 0], members, **tol), name)
                self.assertTrue(
                    torch.allclose(post_t.variance[..., 0], members.var(dim=-2), **tol), name
                )
                self.assertEqual(
                    post_t.rsample(torch.Size([5])).shape, torch.Size([5, 3, 4, 1]), name
                )
                # output_indices first, then the transform (as EnsembleModel.posterior does)
                post_1 = model.posterior(
                    X,
                    output_indices=[m - 1],
                    posterior_transform=ScalarizedPosteriorTransform(w[:1]),
                )
                expected = model.posterior(X, output_indices=[m - 1]).mean * w[0]
                self.assertTrue(torch.allclose(post_1.mean, expected, **tol), name)
                with pytest.raises(ShapeError, match="weights"):
                    model.posterior(X, posterior_transform=ScalarizedPosteriorTransform(
                        torch.ones(m + 1, dtype=dtype)))  # fmt: skip

    def test_latent_gp_adapters(self):
        for dtype in DTYPES:
            X = torch.rand(3, 2, D, dtype=dtype)
            for name, model in latent_adapters(dtype).items():
                m = model.num_outputs
                w = torch.tensor([2.0] if m == 1 else [0.5, -2.0], dtype=dtype)
                post = model.posterior(X)
                post_t = model.posterior(
                    X, posterior_transform=ScalarizedPosteriorTransform(w, 1.5)
                )
                tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}
                mean = post.mean @ w[:, None] + 1.5
                self.assertTrue(torch.allclose(post_t.mean, mean, **tol), name)
                if m == 1:
                    var = 4.0 * post.variance
                    self.assertTrue(torch.allclose(post_t.variance, var, **tol), name)

    def test_scalarized_qlognei_on_an_ensemble(self):
        """The call Ax makes: qLogNEI with a ScalarizedPosteriorTransform on an ensemble."""
        dtype = torch.float64
        x, _, _ = data(dtype)
        model = vboot_two_outputs(dtype)
        tf = ScalarizedPosteriorTransform(torch.tensor([1.0, 0.0], dtype=dtype))
        acqf = qLogNoisyExpectedImprovement(model, X_baseline=x, posterior_transform=tf)
        values = acqf(torch.rand(5, 2, D, dtype=dtype))
        self.assertEqual(values.shape, torch.Size([5]))
        self.assertTrue(bool(torch.isfinite(values).all()))


class TestSubsetOutput(BotorchTestCase):
    def test_ensemble_subset_equals_output_indices(self):
        for dtype in DTYPES:
            model = vboot_two_outputs(dtype)
            X = torch.rand(3, 4, D, dtype=dtype)
            full = model.posterior(X).values
            for idcs in ([1], [0], [1, 0]):
                sub = model.subset_output(idcs)
                self.assertIsInstance(sub, VBootSurrogate)
                self.assertEqual(sub.num_outputs, len(idcs))
                self.assertTrue(torch.allclose(sub.posterior(X).values, full[..., idcs]))
            self.assertEqual(model.num_outputs, 2)  # the original is untouched
            self.assertTrue(torch.equal(model.posterior(X).values, full))
            nested = model.subset_output([1, 0]).subset_output([0])
            self.assertTrue(torch.allclose(nested.posterior(X).values, full[..., [1]]))
            # refitting the copy refits the whole wrapped model and keeps the selection
            sub = fit_gpext_surrogate(model.subset_output([1]),
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
            self.assertTrue(torch.allclose(sub.posterior(X).values, full[..., [1]]))

    def test_single_output_and_classifier_adapters(self):
        dtype = torch.float64
        X = torch.rand(2, 3, D, dtype=dtype)
        adapters = {**ensemble_adapters(dtype), **latent_adapters(dtype)}
        for name, model in adapters.items():
            m = model.num_outputs
            sub = model.subset_output([m - 1])
            self.assertIsNot(sub, model, name)
            self.assertEqual(sub.num_outputs, 1, name)
            self.assertTrue(
                torch.allclose(
                    sub.posterior(X).mean, model.posterior(X, output_indices=[m - 1]).mean
                ),
                name,
            )
        clf = dirichlet(dtype)
        sub = clf.subset_output([1])
        self.assertTrue(torch.allclose(sub.posterior(X).variance,
                                       clf.posterior(X).variance[..., 1:]))  # fmt: skip
        self.assertTrue(torch.allclose(sub.class_probabilities(X), clf.class_probabilities(X)))

    def test_errors(self):
        for model in (vboot_two_outputs(torch.float64), dirichlet(torch.float64)):
            with pytest.raises(InputDataError, match=r"indices in \[0, 2\)"):
                model.subset_output([2])
            with pytest.raises(InputDataError, match="non-empty"):
                model.subset_output([])
            with pytest.raises(InputTypeError, match="list of int"):
                model.subset_output("0")
            with pytest.raises(InputDataError, match="output_indices"):
                model.posterior(torch.rand(1, 1, D, dtype=torch.float64), output_indices=[-1])


def test_objective_fixture_is_not_all_negative():
    """The shifted objectives above are needed: the fixture's own objective changes sign."""
    y = objective(grid(torch.float64)[:, 0])
    assert float(y.min()) < 0 < float(y.max())
