"""InKPCASubspace: the median lengthscale rule and the kernel-matrix check."""

import warnings

import gpytorch
import pytest
import torch

from gpext.errors import InputDataError, NumericalWarning
from gpext.subspace import InKPCASubspace


def _deviations(n=30, d=200, seed=0):
    """A curved trajectory in 5 directions plus noise, deviation norms about 20."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, 5, generator=g, dtype=torch.float64))[0]
    t = torch.linspace(0, 3, n, dtype=torch.float64)
    coords = torch.stack([t, t**2 / 3, torch.sin(2 * t), torch.cos(3 * t), t.sqrt()], -1) * 8
    devs = coords @ basis.T + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)
    devs[0] = 0  # the first deviation of a trajectory is zero
    return devs


def _catch(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    return out, [w for w in rec if issubclass(w.category, NumericalWarning)]


class TestLengthscaleRule:
    def test_default_rbf_gets_the_median_distance_and_full_rank(self):
        devs = _deviations()
        assert 10 < float(devs[1:].norm(dim=-1).median()) < 60
        sub, warned = _catch(lambda: InKPCASubspace(5, gpytorch.kernels.RBFKernel()).fit(devs))
        assert not warned
        first = devs[1:6]  # the first 5 non-zero deviations
        dist = torch.cdist(first, first)
        expected = float(dist[dist > 0].median())
        assert float(sub.kpca.kernel.lengthscale) == pytest.approx(expected, rel=1e-6)
        p = sub.projection
        assert p.shape == (5, 200) and int(torch.linalg.matrix_rank(p)) == 5
        assert sub.num_points == 30

    def test_gpytorch_default_lengthscale_warns_near_identity(self):
        devs = _deviations()
        sub, warned = _catch(
            lambda: InKPCASubspace(5, gpytorch.kernels.RBFKernel(), lengthscale=None).fit(devs)
        )
        assert len(warned) == 1 and "nearly the identity" in str(warned[0].message)
        assert float(sub.kpca.kernel.lengthscale) == pytest.approx(0.6931, abs=1e-3)

    def test_huge_lengthscale_warns_near_constant(self):
        _, warned = _catch(
            lambda: InKPCASubspace(3, gpytorch.kernels.RBFKernel(), lengthscale=1e6).fit(
                _deviations()
            )
        )
        assert len(warned) == 1 and "nearly constant" in str(warned[0].message)

    def test_user_lengthscale_is_kept_by_auto_and_scale_kernels_work(self):
        k = gpytorch.kernels.RBFKernel()
        k.lengthscale = 25.0
        sub, _ = _catch(lambda: InKPCASubspace(3, k).fit(_deviations()))
        assert float(sub.kpca.kernel.lengthscale) == pytest.approx(25.0)
        scaled = gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel(nu=2.5))
        sub = InKPCASubspace(3, scaled, lengthscale="median").fit(_deviations())
        assert float(sub.kpca.kernel.base_kernel.lengthscale) > 5.0
        sub = InKPCASubspace(3, gpytorch.kernels.RBFKernel(), lengthscale=12.0)
        assert float(sub.kpca.kernel.lengthscale) == pytest.approx(12.0)

    def test_projection_before_num_init_deviations(self):
        devs = _deviations()
        sub = InKPCASubspace(2, gpytorch.kernels.RBFKernel())
        for row in devs[:4]:  # 3 non-zero deviations, num_init = 5
            sub.update(row)
        assert sub.num_points == 4 and sub.projection.shape == (2, 200)
        sub.update(devs[4:10])  # keeps going incrementally after the early start
        assert sub.num_points == 10 and sub.projection.shape == (2, 200)

    def test_linear_kernel_is_unchanged_and_errors(self):
        devs = _deviations()
        sub = InKPCASubspace(3).fit(devs)
        assert sub.lengthscale_rule is None and sub.kpca.num_points == 30
        with pytest.raises(InputDataError, match="lengthscale"):
            InKPCASubspace(3, gpytorch.kernels.RBFKernel(), lengthscale="mean")
        with pytest.raises(InputDataError, match="lengthscale"):
            InKPCASubspace(3, gpytorch.kernels.RBFKernel(), lengthscale=-1.0)
