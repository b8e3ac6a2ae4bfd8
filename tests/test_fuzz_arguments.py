"""Issue 40, item 3: argument values and the remaining entries of the fuzz list.

Each case was a raw error (a torch/numpy/Python exception or a bare ``assert``) or a silent
wrong answer before; now it is a gpext error with what was expected, or the right answer.
The kernels and the Nystrom operator are covered by ``tests/test_fuzz_kernels_operators.py``.
"""

from __future__ import annotations

import warnings

import gpytorch
import numpy as np
import pytest
import torch

from gpext.bootstrap import EnsembleMLP, VBootMLP, VBootRFF
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.fit import build_exact_gp, fit_exact_gp
from gpext.models import (
    DirichletGPClassifier,
    GWIClassificationModel,
    GWIRegressionModel,
    InducingGPNetwork,
)
from gpext.nn import MLP, ClassifierMLP, HeteroscedasticMLP
from gpext.subspace import OnlineFactorAnalysis, OutputLikelihood, train_sgd_trajectory
from gpext.utils import check_learning_rate


def _xy(n=30, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, 0]) + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)


BAD_RATES = [(-1.0, InputDataError), (float("nan"), InputDataError), (0.0, InputDataError),
             (float("inf"), InputDataError), ("0.1", InputTypeError)]  # fmt: skip


@pytest.mark.parametrize(("lr", "err"), BAD_RATES)
def test_check_learning_rate(lr, err):
    with pytest.raises(err, match="lr"):
        check_learning_rate(lr, "lr")
    assert check_learning_rate(torch.tensor(0.5), "lr") == 0.5
    assert check_learning_rate(None, "lr", allow_none=True) is None


@pytest.mark.parametrize(("lr", "err"), BAD_RATES[:2])
def test_negative_or_nan_learning_rates_never_reach_adam(lr, err):
    """They reached ``torch.optim`` (a bare ValueError) or, for NaN, ruined the fit."""
    x, y = _xy()
    fits = {
        "InducingGPNetwork.fit.lr": lambda: (
            InducingGPNetwork(MLP(2, [8], 2), num_inducing=4).double().fit(x, y, lr=lr, min_steps=1)
        ),
        "InducingGPNetwork.fit.gp_lr": lambda: (
            InducingGPNetwork(MLP(2, [8], 2), num_inducing=4)
            .double()
            .fit(x, y, gp_lr=lr, min_steps=1)
        ),
        "VBootMLP.fit lr": lambda: VBootMLP(2, [8], dtype=torch.float64).fit(
            x, y, num_epochs=1, lr=lr
        ),
        "train_sgd_trajectory.lr": lambda: train_sgd_trajectory(
            MLP(2, [8], 1).double(),
            x,
            y,
            OutputLikelihood("gaussian", noise_variance=0.1),
            epochs=2,
            swa_start=1,
            lr=lr,
        ),
        "fit_exact_gp.fallback_lr": lambda: fit_exact_gp(build_exact_gp(x, y), fallback_lr=lr),
    }
    for name, fit in fits.items():
        with pytest.raises(err, match=name.replace(".", r"\.")):
            fit()
    model, lik = GWIRegressionModel.from_data(x, y, num_inducing=4, prior_steps=2)
    for kw in ("lr", "mean_lr"):
        with pytest.raises(err, match=f"fit.{kw}"):
            model.fit(lik, x, y, min_steps=1, **{kw: lr})


def test_rmse_overflow_is_covered_in_test_metrics():
    from gpext.metrics import rmse

    assert np.isfinite(rmse([2e200, 0.0], [0.0, 0.0]))


def test_online_factor_analysis_one_observation_without_warmup():
    """``OnlineFactorAnalysis(6, 2, warmup=0).update(t[0]).log_prob(t)`` was
    ``[2119.7, -inf, -inf]``: psi went to 2.2e-308 (the first observation has no spread)."""
    t = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ofa = OnlineFactorAnalysis(6, 2, warmup=0).update(t[0])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        lp = ofa.log_prob(t)
    assert torch.isfinite(lp).all() and float(ofa.psi.min()) >= ofa.psi_min
    assert any("initial values" in str(w.message) for w in rec)
    # identical observations show no spread either: psi is not floored to ~0
    same = OnlineFactorAnalysis(6, 2, warmup=0).update(t[0].expand(5, 6))
    assert torch.isfinite(same.log_prob(t)).all()
    # with spread, the fit moves psi away from its initial value
    ofa = OnlineFactorAnalysis(6, 2, warmup=0).update(torch.randn(50, 6, dtype=torch.float64))
    assert not torch.allclose(ofa.psi, torch.ones(6, dtype=torch.float64))


def test_dirichlet_hyper_subset_and_unused_lr():
    """``hyper_subset=1`` gave accuracy 0.42 instead of 1.0 without a word; ``lr`` was
    silently ignored."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(90, 2, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    with pytest.raises(InputDataError, match="at least 2 \\* num_classes = 6"):
        DirichletGPClassifier(num_classes=3).fit(x, y, hyper_subset=1)
    model = DirichletGPClassifier(num_classes=3)
    model.fit(x, y, hyper_subset=6, generator=torch.Generator().manual_seed(1))
    assert float((model.predict_proba(x).argmax(-1) == y).double().mean()) >= 0.9
    with pytest.warns(DeprecationWarning, match="lr is unused"):
        DirichletGPClassifier(num_classes=3).fit(x, y, lr=0.1, max_iter=2)


def test_stratified_hyper_subset_holds_every_class():
    from gpext.models.dirichlet_gp_classifier import _stratified_subset

    labels = torch.tensor([0] * 50 + [1] * 3 + [2] * 1)
    for seed in range(5):
        idx = _stratified_subset(labels, 5, torch.Generator().manual_seed(seed))
        assert idx.numel() == 5 and idx.unique().numel() == 5
        counts = torch.bincount(labels[idx], minlength=3)
        assert counts[1] == 2 and counts[2] == 1 and counts[0] == 2


def test_vboot_rff_lengthscale_of_the_wrong_size():
    x, y = _xy()
    with pytest.raises(ShapeError, match="one lengthscale per input \\(2\\)"):
        VBootRFF(64, 2, lengthscale=torch.ones(3)).fit(x, y)


def test_gwi_regression_predict_with_a_classification_likelihood():
    x, y = _xy()
    model, lik = GWIRegressionModel.from_data(x, y, num_inducing=4, prior_steps=2)
    model.fit(lik, x, y, min_steps=2, check_fit=False)
    with pytest.raises(InputTypeError, match="GaussianLikelihood"):
        model.predict(gpytorch.likelihoods.BernoulliLikelihood(), x)
    with pytest.raises(InputTypeError, match="GaussianLikelihood"):
        model.noise_variance(gpytorch.likelihoods.BernoulliLikelihood())


@pytest.mark.parametrize("labels", [np.array(["a", "b", "c"] * 10), ["a", "b", "c"] * 10])
def test_gwi_classification_string_labels(labels):
    x, _ = _xy()
    with pytest.raises(InputTypeError, match="np.unique"):
        GWIClassificationModel.from_data(x, labels, num_classes=3, num_inducing=4)


def test_exact_gp_converts_numpy_and_integers_and_rejects_the_rest():
    x, y = _xy()
    a = build_exact_gp(x.numpy(), y.numpy())
    assert a.train_inputs[0].dtype == torch.float64
    b = build_exact_gp((10 * x).long(), y)  # integer inputs: the default dtype
    assert b.train_inputs[0].dtype == torch.get_default_dtype()
    assert b.train_targets.dtype == b.train_inputs[0].dtype
    with pytest.raises(InputTypeError, match="float32 or float64"):
        build_exact_gp(x.half(), y.half())
    with pytest.raises(InputTypeError, match="ExactGP"):
        fit_exact_gp(torch.nn.Linear(2, 1))
    with pytest.raises(InputDataError, match="variances >= 0"):
        build_exact_gp(x, y, noise=-torch.ones(30, dtype=torch.float64))


# ---------------------------------------------------------------------- BoTorch adapters
botorch = pytest.importorskip("botorch")


def test_ign_surrogate_posterior_before_fit():
    """It returned mean 0, variance 0.37 (the network's initial state)."""
    from gpext.integrations.botorch import IGNSurrogate

    x, _ = _xy()
    model = IGNSurrogate(InducingGPNetwork(MLP(2, [8], 2), num_inducing=4).double())
    with pytest.raises(NotFittedError, match="not fitted"):
        model.posterior(x[:3].unsqueeze(-2))


def test_gwi_surrogate_defaults_and_lazy_posterior():
    """``fit_gpext_surrogate(GWISurrogate(train_X=X, train_Y=Y))`` (the README's call) raised
    a TypeError (``epochs`` required); its posterior on N points built the dense N x N
    covariance (100,000 points asked for 80 GB)."""
    from linear_operator.operators import DenseLinearOperator

    from gpext.integrations.botorch import GWISurrogate, fit_gpext_surrogate

    torch.manual_seed(0)
    X = torch.rand(30, 2, dtype=torch.float64)
    Y = torch.sin(6 * X[:, :1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fit_gpext_surrogate(GWISurrogate(train_X=X, train_Y=Y))
    xq = torch.rand(2000, 2, dtype=torch.float64)
    post = model.posterior(xq)
    assert not isinstance(post.distribution.lazy_covariance_matrix, DenseLinearOperator)
    var = post.variance
    assert var.shape == (2000, 1) and bool((var > 0).all())
    small = model.posterior(xq[:5])
    torch.testing.assert_close(small.variance, var[:5])
    torch.testing.assert_close(small.mean, post.mean[:5])


@pytest.mark.parametrize(
    "build",
    [
        lambda h: MLP(2, h, 1),
        lambda h: ClassifierMLP(2, h, 3),
        lambda h: HeteroscedasticMLP(2, h),
        lambda h: EnsembleMLP(3, 2, 1, h),
        lambda h: VBootMLP(3, h),
    ],
    ids=["MLP", "ClassifierMLP", "HeteroscedasticMLP", "EnsembleMLP", "VBootMLP"],
)
def test_hidden_widths_take_one_integer_or_a_sequence(build):
    """``MLP(2, 64, 1)`` was a raw ``TypeError: 'int' object is not iterable``."""
    one, seq = build(64), build([64])
    assert [p.shape for p in one.parameters()] == [p.shape for p in seq.parameters()]
    with pytest.raises(InputTypeError, match="sequence of integers"):
        build("64")
    with pytest.raises(InputDataError, match=r"\[1\]"):
        build([64, 0])


def test_vboot_mlp_fit_takes_epochs_like_every_other_fit():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g)
    y = x[:, 0] + 0.1 * torch.randn(30, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = VBootMLP(2, 8).fit(x, y, epochs=3, batch_size=10, check=False)
        old = VBootMLP(2, 8).fit(x, y, num_epochs=3, batch_size=10, check=False)
    assert len(res.losses) == len(old.losses) == 3
    with pytest.raises(InputDataError, match="not both"):
        VBootMLP(2, 8).fit(x, y, epochs=3, num_epochs=3)
