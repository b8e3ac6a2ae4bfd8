"""The vectorised ensemble equals K separately built NTK MLPs (outputs and gradients)."""

import math

import pytest
import torch

from gpext.bootstrap import EnsembleMLP
from gpext.errors import InputDataError, ShapeError


class _ReferenceNTKMLP(torch.nn.Module):
    """One MLP built from torch.nn.Linear layers with the NTK scaling of 001 Eq. (2)."""

    def __init__(self, sizes, dtype):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, dtype=dtype) for a, b in zip(sizes[:-1], sizes[1:])
        )

    def forward(self, x):
        h = x
        for i, lin in enumerate(self.layers):
            h = torch.nn.functional.linear(h, lin.weight) / math.sqrt(lin.in_features) + lin.bias
            if i < len(self.layers) - 1:
                h = torch.relu(h)
        return h


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
class TestEnsembleMatchesSeparateNetworks:
    seed = 21

    def _setup(self, dtype, k=4, sizes=(5, 16, 8, 3)):
        torch.manual_seed(self.seed)
        refs = [_ReferenceNTKMLP(sizes, dtype) for _ in range(k)]
        ens = EnsembleMLP(k, sizes[0], sizes[-1], sizes[1:-1], dtype=dtype)
        for j, ref in enumerate(refs):
            tensors = [lin.weight.detach().T for lin in ref.layers]
            tensors += [lin.bias.detach()[None, :] for lin in ref.layers]
            ens.load_particle(j, tensors)
        return refs, ens

    def test_outputs_and_gradients(self, dtype):
        refs, ens = self._setup(dtype)
        x = torch.randn(11, 5, dtype=dtype)
        target = torch.randn(4, 11, 3, dtype=dtype)
        out = ens(x)
        assert out.shape == (4, 11, 3)
        ((out - target) ** 2).sum().backward()
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        for j, ref in enumerate(refs):
            y = ref(x)
            torch.testing.assert_close(out[j].detach(), y.detach(), **tol)
            ((y - target[j]) ** 2).sum().backward()
            for layer, lin in enumerate(ref.layers):
                torch.testing.assert_close(ens.weights[layer].grad[j], lin.weight.grad.T, **tol)
                torch.testing.assert_close(ens.biases[layer].grad[j, 0], lin.bias.grad, **tol)

    def test_per_particle_inputs(self, dtype):
        refs, ens = self._setup(dtype)
        x = torch.randn(4, 7, 5, dtype=dtype)
        out = ens(x)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        for j, ref in enumerate(refs):
            torch.testing.assert_close(out[j].detach(), ref(x[j]).detach(), **tol)

    def test_squared_distance_and_particle_copy(self, dtype):
        _, ens = self._setup(dtype)
        anchors = [torch.zeros_like(p) for p in ens.stacked_parameters()]
        expected = torch.stack(
            [sum(t.pow(2).sum() for t in ens.particle(j)) for j in range(ens.num_particles)]
        )
        torch.testing.assert_close(ens.squared_distance(anchors).detach(), expected)
        assert [t.shape for t in ens.particle(0)] == ens.parameter_shapes()


def test_errors():
    ens = EnsembleMLP(3, 4, 2, (8,))
    with pytest.raises(ShapeError, match="shape"):
        ens(torch.randn(5, 3))
    with pytest.raises(ShapeError, match="leading size"):
        ens(torch.randn(2, 5, 4))
    with pytest.raises(InputDataError, match="num_particles"):
        EnsembleMLP(0, 4, 2)
    with pytest.raises(InputDataError, match="dtype"):
        EnsembleMLP(2, 4, 2, dtype=torch.float16)
    with pytest.raises(InputDataError, match="anchors"):
        ens.squared_distance([torch.zeros(1)])
    with pytest.raises(ShapeError, match="load_particle"):
        ens.load_particle(0, [torch.zeros(2, 2)] * 4)


def test_state_dict_round_trip():
    torch.manual_seed(0)
    a = EnsembleMLP(2, 3, 2, (4,))
    for p in a.parameters():
        torch.nn.init.normal_(p)
    b = EnsembleMLP(2, 3, 2, (4,))
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 3)
    torch.testing.assert_close(a(x), b(x))


def test_forward_input_contract():
    import numpy as np

    from gpext.errors import InputDataError, InputTypeError

    net = EnsembleMLP(2, 3, 1, [4], dtype=torch.float32)
    x = np.random.default_rng(0).normal(size=(5, 3))
    out = net(x)  # AttributeError ('numpy.ndarray' has no 'dim') before
    torch.testing.assert_close(out, net(torch.as_tensor(x, dtype=torch.float32)))
    assert net([[0, 1, 2]]).shape == (2, 1, 1)
    with pytest.raises(InputDataError, match="at least one row"):  # an empty output before
        net(torch.zeros(0, 3))
    with pytest.raises(InputDataError, match="finite"):  # NaN outputs before
        net(torch.full((2, 3), float("nan")))
    with pytest.raises(InputTypeError, match="float32"):  # raw matmul dtype error before
        net(torch.zeros(2, 3, dtype=torch.float64))
