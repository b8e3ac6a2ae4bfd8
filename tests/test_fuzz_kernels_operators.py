"""Fuzz test of the input contract for gpext's kernels and the Nystrom-KPCA operator (issue 40).

Bad inputs to ``RandomFourierFeaturesKernel``, ``NeuralTangentKernel``, ``FeatureMapKernel`` and
``NystromKPCAKernel`` (numpy arrays, integer / float16 / mixed dtypes, mismatched feature
counts, NaN and infinite entries) and to ``NystromKPCALinearOperator`` (NaN or negative
eigenvalues, mixed dtypes, wrong-shape products) must give a :class:`gpext.errors.GpextError`
or the right answer, never a raw torch error or a silent NaN matrix.  Numpy arrays and integer
tensors are converted to the kernel's dtype, as the models' ``as_model_input`` does.
"""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.kernels import (
    FeatureMapKernel,
    NeuralTangentKernel,
    NystromKPCAKernel,
    RandomFourierFeaturesKernel,
)
from gpext.nn import MLP
from gpext.operators import NystromKPCALinearOperator

D = 2


def _rff():
    return RandomFourierFeaturesKernel(64, num_dims=D, generator=torch.Generator().manual_seed(0))


def _ntk():
    # non-integer variances: a kernel that cast them to the inputs' integer dtype would be wrong
    return NeuralTangentKernel(num_layers=2, weight_variance=1.5, bias_variance=0.5)


def _fmk():
    torch.manual_seed(0)
    return FeatureMapKernel(MLP(D, [8], 3))


def _nystrom():
    z = torch.randn(12, D, generator=torch.Generator().manual_seed(1))
    return NystromKPCAKernel(gpytorch.kernels.RBFKernel(), z)


KERNELS = {"rff": _rff, "ntk": _ntk, "feature_map": _fmk, "nystrom": _nystrom}
NAMES = {
    "rff": "RandomFourierFeaturesKernel",
    "ntk": "NeuralTangentKernel",
    "feature_map": "FeatureMapKernel",
    "nystrom": "NystromKPCAKernel",
}


def _x(n=5, dtype=torch.float32, seed=2):
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _dense(out):
    return out.to_dense() if hasattr(out, "to_dense") else out


# ---------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_numpy_inputs_are_converted_to_the_kernel_dtype(kind, dtype):
    kernel = KERNELS[kind]().to(dtype)
    x1, x2 = _x(5, dtype), _x(4, dtype, seed=3)
    ref = kernel(x1, x2).to_dense()
    out = kernel(x1.numpy(), x2.numpy()).to_dense()
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(kernel(x1.double().numpy()).to_dense(), kernel(x1).to_dense())
    torch.testing.assert_close(kernel(x1.numpy(), diag=True), kernel(x1, diag=True))


@pytest.mark.parametrize("kind", ["rff", "ntk", "feature_map"])  # Nystrom handled them already
def test_integer_inputs_are_converted_to_the_kernel_dtype(kind):
    kernel = KERNELS[kind]()
    xi = torch.tensor([[0, 1], [2, -1], [1, 1]])
    ref = kernel(xi.float()).to_dense()
    torch.testing.assert_close(kernel(xi).to_dense(), ref)
    wrapped = gpytorch.kernels.ScaleKernel(kernel)  # GPyTorch calls forward directly
    torch.testing.assert_close(wrapped(xi).to_dense(), wrapped(xi.float()).to_dense())


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_half_precision_inputs_raise_input_type_error(kind, low):
    kernel = KERNELS[kind]()
    with pytest.raises(InputTypeError, match=f"{NAMES[kind]} x1: expected float32 or float64"):
        kernel(_x().to(low)).to_dense()
    with pytest.raises(InputTypeError, match="float32 or float64"):
        gpytorch.kernels.ScaleKernel(kernel)(_x().to(low)).to_dense()


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_x1_and_x2_of_two_dtypes_raise_input_type_error(kind):
    kernel = KERNELS[kind]()
    with pytest.raises(InputTypeError, match="inputs of one dtype"):
        kernel(_x(), _x(3).double()).to_dense()
    with pytest.raises(InputTypeError, match="inputs of one dtype"):
        kernel(_x(), _x(5).double(), diag=True)


@pytest.mark.parametrize("kind", ["feature_map", "nystrom"])
def test_inputs_of_another_dtype_than_the_kernel_raise_input_type_error(kind):
    # a network's weights and stored landmarks cannot follow the inputs' dtype
    kernel = KERNELS[kind]()  # float32
    with pytest.raises(InputTypeError, match=r"kernel\.to\(torch\.float64\)"):
        kernel(_x(dtype=torch.float64)).to_dense()
    with pytest.raises(InputTypeError, match="torch.float32"):
        gpytorch.kernels.ScaleKernel(kernel)(_x(dtype=torch.float64), diag=True)


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_x1_and_x2_with_different_feature_counts_raise_shape_error(kind):
    kernel = KERNELS[kind]()
    x2 = torch.randn(3, D + 1)
    with pytest.raises(ShapeError, match=f"{NAMES[kind]} .x1, x2.: expected x1 and x2 with"):
        kernel(_x(), x2)
    with pytest.raises(ShapeError, match="same number of features"):
        kernel.forward(_x(), x2)


@pytest.mark.parametrize(
    "network",
    [
        lambda: nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 3)),
        lambda: nn.Linear(D, 3),
    ],
    ids=["sequential", "linear"],
)
def test_feature_count_that_disagrees_with_the_network_raises_shape_error(network):
    kernel = FeatureMapKernel(network(), num_features=3)
    x = torch.randn(5, D + 1)
    with pytest.raises(ShapeError, match=f"FeatureMapKernel inputs: expected {D} features"):
        kernel(x).to_dense()
    with pytest.raises(ShapeError, match=f"expected {D} features"):
        kernel(x, diag=True)
    with pytest.raises(ShapeError, match=f"expected {D} features"):
        kernel.features(x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_non_finite_inputs_raise_input_data_error(kind, bad):
    kernel = KERNELS[kind]()
    x = _x()
    x[1, 0] = bad
    match = f"{NAMES[kind]} x1: expected finite values"
    with pytest.raises(InputDataError, match=match):
        kernel(x).to_dense()
    with pytest.raises(InputDataError, match=match):
        kernel(x, diag=True)
    with pytest.raises(InputDataError, match=f"{NAMES[kind]} x2: expected finite values"):
        kernel(_x(3), x).to_dense()
    with pytest.raises(InputDataError, match=match):  # through GPyTorch's wrappers
        gpytorch.kernels.ScaleKernel(kernel)(x).to_dense()
    x_batch = torch.stack([_x(), x])  # batch dimensions
    with pytest.raises(InputDataError, match="finite values"):
        kernel(x_batch).to_dense()


# ---------------------------------------------------------------------------- the operator
def _u(n=6, r=2, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    return torch.linalg.qr(torch.randn(n, r, dtype=dtype, generator=gen)).Q


@pytest.mark.parametrize("where", ["eigenvalues", "eigenvectors"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_operator_with_non_finite_factors_raises_input_data_error(where, bad):
    u, lam = _u(), torch.tensor([2.0, 1.0], dtype=torch.float64)
    (lam if where == "eigenvalues" else u)[0] = bad
    with pytest.raises(InputDataError, match=f"NystromKPCALinearOperator {where}: expected finite"):
        NystromKPCALinearOperator(u, lam)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_operator_with_negative_eigenvalues_raises_input_data_error(dtype):
    lam = torch.tensor([2.0, -0.5], dtype=dtype)
    with pytest.raises(InputDataError, match="non-negative values .a positive semi-definite"):
        NystromKPCALinearOperator(_u(dtype=dtype), lam)


def test_operator_with_mixed_dtypes_raises_input_type_error():
    with pytest.raises(InputTypeError, match="of one dtype on one device"):
        NystromKPCALinearOperator(_u(), torch.tensor([2.0, 1.0], dtype=torch.float32))
    with pytest.raises(InputTypeError, match="of one dtype on one device"):
        NystromKPCALinearOperator(_u(dtype=torch.float32), torch.tensor([2.0, 1.0]).double())


@pytest.mark.parametrize(
    "shape", [(5, 2), (5,), (6, 6, 2), (3, 6, 2)], ids=["rows", "vector", "batch6", "batch3"]
)
def test_operator_matmul_of_the_wrong_shape_raises_shape_error(shape):
    u = torch.randn(2, 6, 2, dtype=torch.float64)  # batch of 2
    op = NystromKPCALinearOperator(u, torch.ones(2, 2, dtype=torch.float64))
    rhs = torch.randn(*shape, dtype=torch.float64)  # batches 6 and 3 do not broadcast with 2
    with pytest.raises(ShapeError, match=r"NystromKPCALinearOperator.matmul other: expected shape"):
        op @ rhs
    with pytest.raises(ShapeError, match="expected shape"):
        torch.matmul(op, rhs)


def test_operator_matmul_of_another_dtype_raises_input_type_error():
    op = NystromKPCALinearOperator(_u(), torch.tensor([2.0, 1.0], dtype=torch.float64))
    with pytest.raises(InputTypeError, match=r"other.to\(torch.float64\)"):
        op @ torch.randn(6, 2)
    with pytest.raises(InputTypeError, match="a torch.Tensor or LinearOperator"):
        op.matmul(np.ones((6, 2)))
