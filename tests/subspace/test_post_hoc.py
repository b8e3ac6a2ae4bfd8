"""A post-hoc SWA start from a pretrained network (gpext.subspace.collect_from_pretrained)."""

import math

import pytest
import torch

from gpext.errors import InputDataError, ShapeError
from gpext.nn import MLP
from gpext.subspace import (
    SWAG,
    FlatParameters,
    OutputLikelihood,
    collect_from_pretrained,
    mean_negative_log_likelihood,
)


def _pretrained(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(120, 2, generator=gen, dtype=dtype) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(120, generator=gen, dtype=dtype)
    torch.manual_seed(seed)
    net = MLP(2, [32], 1).to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)  # any optimiser
    for _ in range(300):
        opt.zero_grad()
        ((net(x)[:, 0] - y) ** 2).mean().backward()
        opt.step()
    return net, x, y


class TestCollectFromPretrained:
    @pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
    def test_rate_choice_and_trajectory(self, dtype):
        net, x, y = _pretrained(dtype)
        w0 = FlatParameters(net).flatten().detach().clone()
        lik = OutputLikelihood("homoscedastic_gaussian")
        with torch.no_grad():
            mle = float(((net(x)[:, 0] - y) ** 2).double().mean())
        start = OutputLikelihood("gaussian", noise_variance=mle)
        start_nll = mean_negative_log_likelihood(net, x, y, start)
        traj = collect_from_pretrained(net, x, y, lik, epochs=8, tolerance=0.1,
                                       generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert traj.num_collected == 8 and traj.swa_weights().dtype == dtype
        assert traj.post_hoc_lr in (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4)
        # the trajectory stays in the pretrained basin: the SWA mean fits about as well
        swa_net = MLP(2, [32], 1).to(dtype)
        FlatParameters(swa_net).assign(traj.swa_weights(), swa_net)
        swa_lik = OutputLikelihood("homoscedastic_gaussian")
        with torch.no_grad():
            swa_lik.fit_noise(swa_net(x), y)
        assert mean_negative_log_likelihood(swa_net, x, y, swa_lik) < start_nll + 0.3
        assert float((traj.swa_weights() - w0).norm()) > 0  # it moved
        assert SWAG.from_trajectory(traj).sample(3).shape == (3, w0.numel())
        # the learned noise: the closed form at the SWA mean
        assert math.isclose(lik.noise_variance, swa_lik.noise_variance, rel_tol=1e-4)

    def test_rate_rule_rejects_rates_that_leave_the_basin(self):
        net, x, y = _pretrained(torch.float64)
        lik = OutputLikelihood("gaussian", noise_variance=0.01)
        # a huge first candidate must be rejected by the one-epoch trial
        traj = collect_from_pretrained(net, x, y, lik, epochs=3, lr_candidates=(50.0, 1e-3),
                                       generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert traj.post_hoc_lr == 1e-3
        # the trials are recorded, with their warnings, instead of being silenced
        trials = traj.post_hoc_lr_trials
        assert [t["lr"] for t in trials] == [50.0, 1e-3]
        assert not trials[0]["accepted"]
        assert trials[0]["nll"] > trials[1]["nll"]

    def test_trial_warnings_are_recorded_not_shown(self, recwarn):
        net, x, y = _pretrained(torch.float64)
        lik = OutputLikelihood("gaussian", noise_variance=0.01)
        traj = collect_from_pretrained(net, x, y, lik, epochs=3, lr_candidates=(50.0, 1e-3),
                                       generator=torch.Generator().manual_seed(0))  # fmt: skip
        # the rate of 50 leaves the basin: its collapse warning is kept with its trial and not
        # shown (the run that follows is at 1e-3)
        bad = traj.post_hoc_lr_trials[0]
        assert any(msg.startswith("VarianceCollapseWarning") for msg in bad["warnings"])
        shown = {str(w.message) for w in recwarn}
        assert all(msg.split(": ", 1)[1] not in shown for msg in bad["warnings"])

    def test_explicit_rate_and_errors(self):
        net, x, y = _pretrained(torch.float32)
        lik = OutputLikelihood("gaussian", noise_variance=0.01)
        traj = collect_from_pretrained(net, x, y, lik, epochs=2, lr=1e-3)
        assert traj.post_hoc_lr == 1e-3 and traj.num_collected == 2
        assert traj.post_hoc_lr_trials == []
        with pytest.raises(InputDataError):
            collect_from_pretrained(net, x, y, lik, epochs=1)
        with pytest.raises(InputDataError):
            collect_from_pretrained(net, x, y, lik, lr=-1.0)
        with pytest.raises(InputDataError):
            collect_from_pretrained(net, x, y, lik, tolerance=0.0)
        with pytest.raises(ShapeError):
            collect_from_pretrained(net, x, y[:5], lik)
