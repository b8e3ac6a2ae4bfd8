"""The curve (Bezier) subspace and the random subspace (issue 21, item 3)."""

import io

import pytest
import torch

from gpext.errors import InputDataError, NotFittedError, ShapeError
from gpext.subspace import (
    CurveSubspace,
    FlatParameters,
    OutputLikelihood,
    RandomSubspace,
    SubspaceModel,
    bezier_point,
)


def _net(seed: int, dtype=torch.float64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(
        dtype
    )


def _data(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.linspace(-3, 3, 120, dtype=dtype).unsqueeze(-1)
    y = (2 * x).sin().squeeze(-1) + 0.05 * torch.randn(120, generator=gen, dtype=dtype)
    return x, y


def _train(net, x, y, steps=1500):
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        (net(x).squeeze(-1) - y).pow(2).mean().backward()
        opt.step()
    return FlatParameters(net).flatten()


@pytest.fixture(scope="module")
def two_solutions():
    x, y = _data()
    net = _net(0)
    w0 = _train(net, x, y)
    w1 = _train(_net(1), x, y)
    return net, w0, w1, x, y


class TestRandomSubspace:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_orthogonal_directions_scaled_by_the_spread(self, dtype):
        gen = torch.Generator().manual_seed(0)
        devs = (torch.randn(30, 200, generator=gen) * torch.linspace(0.1, 3, 200)).to(dtype)
        sub = RandomSubspace(rank=5).fit(devs, generator=torch.Generator().manual_seed(1))
        p = sub.projection
        assert p.shape == (5, 200) and p.dtype == dtype
        norms = p.norm(dim=1)
        q = p / norms[:, None]
        torch.testing.assert_close(q @ q.T, torch.eye(5, dtype=dtype), atol=1e-5, rtol=0)
        spread = ((devs @ q.T).pow(2).sum(0) / 29).sqrt()  # s_j of the docstring
        torch.testing.assert_close(norms, spread, rtol=1e-4, atol=0)

    def test_without_deviations_rows_have_norm_scale(self):
        sub = RandomSubspace(rank=3, scale=0.5).fit(None, num_parameters=40)
        torch.testing.assert_close(sub.projection.norm(dim=1), torch.full((3,), 0.5))

    def test_errors_and_state_dict(self):
        with pytest.raises(NotFittedError):
            _ = RandomSubspace(2).projection
        with pytest.raises(InputDataError, match="num_parameters"):
            RandomSubspace(2).fit(None)
        with pytest.raises(InputDataError, match="at most the number of weights"):
            RandomSubspace(5).fit(torch.randn(4, 3))
        with pytest.raises(InputDataError, match="at least 2"):
            RandomSubspace(1).fit(torch.randn(1, 3))
        with pytest.raises(ShapeError):
            RandomSubspace(1).fit(torch.randn(3))
        sub = RandomSubspace(2).fit(torch.randn(6, 10))
        buf = io.BytesIO()
        torch.save(sub.state_dict(), buf)
        buf.seek(0)
        new = RandomSubspace(2)
        new.load_state_dict(torch.load(buf))
        torch.testing.assert_close(new.projection, sub.projection)


class TestCurveSubspace:
    def test_bezier_end_points(self):
        a, c, b = torch.randn(3, 7).unbind(0)
        torch.testing.assert_close(bezier_point(a, c, b, 0.0), a)
        torch.testing.assert_close(bezier_point(a, c, b, 1.0), b)
        torch.testing.assert_close(bezier_point(a, c, b, 0.5), 0.25 * a + 0.5 * c + 0.25 * b)

    def test_curve_lies_in_the_plane_and_has_lower_loss_than_the_chord(self, two_solutions):
        net, w0, w1, x, y = two_solutions
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        sub = CurveSubspace(epochs=150, lr=5e-3, weight_decay=0.0).fit(
            net, w0, w1, (x, y), lik, generator=torch.Generator().manual_seed(0)
        )
        p, c = sub.projection, sub.center
        assert p.shape == (2, w0.numel())
        assert abs(float(p[0] @ p[1])) < 1e-8 * float(p.norm() ** 2)
        for t, theta in ((0.0, (-1.0, 0.0)), (1.0, (1.0, 0.0))):
            torch.testing.assert_close(sub.curve_coordinates(t), torch.tensor(theta).double())
        for t in (0.2, 0.5, 0.9):  # the whole curve is w_hat + P^T theta(t)
            w = c + p.T @ sub.curve_coordinates(t)
            torch.testing.assert_close(w, sub.curve_point(t), atol=1e-9, rtol=1e-9)
        flat = FlatParameters(net)

        def mse(w):
            with torch.no_grad():
                return float((flat.functional_call(w, x).squeeze(-1) - y).pow(2).mean())

        # independently trained solutions: the straight chord crosses a loss barrier, the
        # trained curve (mode connectivity) does not
        chord = max(mse(0.5 * (w0 + w1)), mse(0.3 * w0 + 0.7 * w1))
        curve = max(mse(sub.curve_point(0.5)), mse(sub.curve_point(0.7)))
        ends = max(mse(w0), mse(w1))
        assert chord > 3 * ends
        assert curve < 0.5 * chord
        assert sub.losses[-1] < sub.losses[0]

    def test_fit_leaves_batch_norm_statistics_of_the_module_alone(self):
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        ).double()
        x = torch.randn(64, 2, dtype=torch.float64)
        y = x.sum(-1)
        w0 = FlatParameters(net).flatten()
        w1 = w0 + 0.1 * torch.randn_like(w0)
        before = {n: b.clone() for n, b in net.named_buffers()}
        net.eval()
        lik = OutputLikelihood("gaussian", noise_variance=0.1)
        CurveSubspace(epochs=2).fit(net, w0, w1, (x, y), lik)
        for name, buf in net.named_buffers():
            torch.testing.assert_close(buf, before[name], rtol=0, atol=0)
        assert not net.training

    def test_usable_in_a_subspace_model_and_with_a_loader(self, two_solutions):
        net, w0, w1, x, y = two_solutions
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True
        )
        sub = CurveSubspace(epochs=3).fit(net, w0, w1, loader, lik)
        model = SubspaceModel(net, sub.center, sub.projection, lik, prior_std=1.0)
        thetas = model.sample_ess(x, y, 8, burn_in=4, generator=torch.Generator().manual_seed(0))
        assert thetas.shape == (8, 2) and torch.isfinite(thetas).all()

    def test_errors_and_state_dict(self, two_solutions):
        net, w0, w1, x, y = two_solutions
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        with pytest.raises(NotFittedError):
            _ = CurveSubspace().projection
        with pytest.raises(InputDataError, match="two different"):
            CurveSubspace(epochs=1).fit(net, w0, w0.clone(), (x, y), lik)
        with pytest.raises(ShapeError):
            CurveSubspace(epochs=1).fit(net, w0[:-1], w1, (x, y), lik)
        with pytest.raises(ShapeError, match="same number of rows"):
            CurveSubspace(epochs=1).fit(net, w0, w1, (x, y[:-1]), lik)
        with pytest.raises(InputDataError, match="N >= 1"):
            CurveSubspace(epochs=1).fit(net, w0, w1, (x[:0], y[:0]), lik)
        with pytest.raises(InputDataError, match="non-negative"):
            CurveSubspace(lr=-1.0)
        sub = CurveSubspace(epochs=1).fit(net, w0, w1, (x, y), lik)
        buf = io.BytesIO()
        torch.save(sub.state_dict(), buf)
        buf.seek(0)
        new = CurveSubspace()
        new.load_state_dict(torch.load(buf))
        torch.testing.assert_close(new.projection, sub.projection)
        torch.testing.assert_close(new.center, sub.center)
