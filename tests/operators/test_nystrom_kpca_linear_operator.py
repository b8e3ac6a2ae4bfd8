"""linear_operator's shipped suites and GPyTorch usage for NystromKPCALinearOperator."""

import unittest

import gpytorch
import linear_operator
import torch
from linear_operator.operators import LowRankRootAddedDiagLinearOperator
from linear_operator.test.linear_operator_test_case import (
    LinearOperatorTestCase,
    RectangularLinearOperatorTestCase,
)

from gpext.errors import InputDataError, ShapeError
from gpext.operators import NystromKPCALinearOperator


def _set_linear_operator_settings(case):
    # ``import botorch`` flips global defaults; pin the ones the suites depend on.
    stack = [
        linear_operator.settings.fast_computations(
            covar_root_decomposition=True, log_prob=True, solves=True
        ),
        linear_operator.settings.max_cholesky_size(800),
        linear_operator.settings.cholesky_jitter(float_value=1e-6, double_value=1e-8),
    ]
    for ctx in stack:
        ctx.__enter__()
        case.addCleanup(ctx.__exit__, None, None, None)


class TestNystromKPCALinearOperatorLowRank(RectangularLinearOperatorTestCase, unittest.TestCase):
    seed = 0

    def setUp(self):
        super().setUp()
        _set_linear_operator_settings(self)

    def create_linear_op(self):
        u = torch.randn(2, 6, 3)
        lam = torch.rand(2, 3) + 0.5
        return NystromKPCALinearOperator(u, lam)

    def evaluate_linear_op(self, linear_op):
        u, lam = linear_op.eigenvectors, linear_op.eigenvalues
        return u @ torch.diag_embed(lam) @ u.mT


class TestNystromKPCALinearOperatorFullRank(LinearOperatorTestCase, unittest.TestCase):
    seed = 1
    # root_decomposition is exact (U L^{1/2}); Lanczos must not be called.
    should_call_lanczos = False

    def setUp(self):
        super().setUp()
        _set_linear_operator_settings(self)

    def create_linear_op(self):
        u = torch.linalg.qr(torch.randn(5, 5)).Q
        lam = torch.linspace(0.5, 3.0, 5)
        return NystromKPCALinearOperator(u, lam)

    def evaluate_linear_op(self, linear_op):
        u, lam = linear_op.eigenvectors, linear_op.eigenvalues
        return u @ torch.diag_embed(lam) @ u.mT


class TestNystromKPCALinearOperatorUsage(unittest.TestCase):
    def setUp(self):
        _set_linear_operator_settings(self)
        self.gen = torch.Generator().manual_seed(3)

    def test_root_diag_and_mvn(self):
        for dtype in (torch.float32, torch.float64):
            u = torch.randn(30, 4, generator=self.gen, dtype=dtype)
            lam = torch.rand(4, generator=self.gen, dtype=dtype) + 0.1
            op = NystromKPCALinearOperator(u, lam)
            dense = (u * lam) @ u.T
            root = op.root_decomposition().root.to_dense()
            self.assertEqual(root.shape, (30, 4))
            torch.testing.assert_close(root @ root.T, dense)
            torch.testing.assert_close(op.diagonal(), torch.diagonal(dense))
            noisy = op.add_diagonal(torch.tensor(0.1, dtype=dtype))
            self.assertIsInstance(noisy, LowRankRootAddedDiagLinearOperator)
            y = torch.randn(30, generator=self.gen, dtype=dtype)
            mvn = gpytorch.distributions.MultivariateNormal(torch.zeros(30, dtype=dtype), noisy)
            ref = torch.distributions.MultivariateNormal(
                torch.zeros(30, dtype=torch.float64),
                dense.double() + 0.1 * torch.eye(30, dtype=torch.float64),
            )
            tol = 1e-3 if dtype == torch.float32 else 1e-8
            self.assertAlmostEqual(
                float(mvn.log_prob(y)), float(ref.log_prob(y.double())), delta=tol * 100
            )
            lik = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
            marg = lik(gpytorch.distributions.MultivariateNormal(torch.zeros(30, dtype=dtype), op))
            self.assertTrue(torch.isfinite(marg.log_prob(y)))
            sample = gpytorch.distributions.MultivariateNormal(
                torch.zeros(30, dtype=dtype), op
            ).rsample(torch.Size([2]))
            self.assertEqual(sample.shape, (2, 30))

    def test_errors(self):
        with self.assertRaisesRegex(ShapeError, "eigenvalues"):
            NystromKPCALinearOperator(torch.randn(5, 3), torch.ones(2))
        with self.assertRaisesRegex(InputDataError, "non-negative"):
            NystromKPCALinearOperator(torch.randn(5, 2), torch.tensor([1.0, -1.0])).low_rank_root()

    def test_negative_constant_gives_a_generic_operator(self):
        u = torch.randn(5, 2, generator=self.gen, dtype=torch.float64)
        op = NystromKPCALinearOperator(u, torch.tensor([2.0, 0.0], dtype=torch.float64))
        neg = op * -2.0
        self.assertNotIsInstance(neg, NystromKPCALinearOperator)
        torch.testing.assert_close(neg.to_dense(), -2.0 * op.to_dense())
        self.assertIsInstance(op * 3.0, NystromKPCALinearOperator)
        rhs = torch.randn(5, 3, generator=self.gen, dtype=torch.float64)
        torch.testing.assert_close(op @ rhs, op.to_dense() @ rhs)
