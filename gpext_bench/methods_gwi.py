"""GWI methods registered in ``gpext bench``.

* ``gwi``: GWI regression (:class:`gpext.models.GWIRegressionModel`): exact-GP prior fitted on a
  subset and frozen (MAP with default priors and restarts, :func:`gpext.fit.fit_exact_gp`),
  mean = whitened kernel expansion (trainable centres starting at the
  inducing points and its own trainable copy of the kernel) + MLP, started at the sparse-GP
  posterior mean, ``M`` greedily chosen data points as (fixed) inducing points of ``r``,
  minibatch Adam on :class:`gpext.mlls.GWIObjective`; from
  :data:`~gpext.fit.AUTO_VALIDATION_MIN_POINTS` (200) training rows up,
  :func:`gpext.fit.validation_rows` of them (10%, at least 50) are held out for early stopping,
  the temperature and the held-out checks; below it the library's own default runs (a refit on
  80% of the rows calibrates the temperature and checks the fit on the other 20%).  A plain 10%
  of a 60-row table used to be 6 rows: the temperature was fitted on them and too few were left
  for any check (test NLL 5.25 against the exact GP's 1.29, coverage 0.53, no warning).
* ``gwi_robustmax``: GWI classification (:class:`gpext.models.GWIClassificationModel`) with the
  robust-max likelihood; a small CNN mean for image data (MNIST), an MLP otherwise.
"""

from __future__ import annotations

import torch

from gpext.fit import AUTO_VALIDATION_MIN_POINTS, validation_rows
from gpext.models.gwi_classification_model import GWIClassificationModel
from gpext.models.gwi_regression_model import GWIRegressionModel
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = ["fit_gwi_classification", "fit_gwi_regression", "validation_split"]


def validation_split(x: torch.Tensor, y: torch.Tensor, fraction: float, generator: torch.Generator):
    """Seeded random hold-out: ``(x_train, y_train, x_val, y_val)``, with
    :func:`gpext.fit.validation_rows` (``fraction``, but at least 50 or a quarter) held out."""
    n = x.shape[0]
    perm = torch.randperm(n, generator=generator).to(x.device)
    nv = max(1, validation_rows(n, fraction))
    return x[perm[nv:]], y[perm[nv:]], x[perm[:nv]], y[perm[:nv]]


@register_method(
    "gwi",
    task="regression",
    description="GWI: W2 to a frozen exact-GP prior, kernel+MLP mean, validation temperature",
)
def fit_gwi_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Fit :class:`GWIRegressionModel` and predict with the calibrated temperature.

    Budget (quick / full): ``M`` = 64 / 256 inducing points chosen greedily from the data (the
    SVGP baseline's counts), about 300 / 1500 Adam steps (batches of 256, the baseline's step
    count), prior fit 50 / 150 L-BFGS iterations per start.  Learning rates: 0.02 for the mean
    :math:`m_Q` (its whitened expansion coefficients, centres, kernel copy and network: the
    SVGP baseline's learning rate, for the parameters that play the role of SVGP's variational
    mean, inducing locations and kernel) and 1e-3 for ``L`` and the noise.  10% of the training split is held out for
    early stopping and the temperature.
    """
    gen = torch.Generator().manual_seed(config.seed)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    held_out = x.shape[0] >= AUTO_VALIDATION_MIN_POINTS
    xt, yt, xv, yv = validation_split(x, y, 0.1, gen) if held_out else (x, y, None, None)
    model, likelihood = GWIRegressionModel.from_data(
        xt, yt, num_inducing=config.budget(64, 256), prior_points=1000, mean="kernel+network",
        adaptive_mean=True,
        prior_steps=config.budget(50, 150), generator=gen, show_progress=config.show_progress,
    )  # fmt: skip
    n = xt.shape[0]
    batch_size = min(n, 256)
    epochs = max(1, config.budget(300, 1500) * batch_size // n)
    result = model.fit(
        likelihood, xt, yt, epochs=epochs, batch_size=batch_size, lr=1e-3, mean_lr=0.02,
        x_val=xv, y_val=yv, eval_every=max(1, epochs // 50), generator=gen,
        show_progress=config.show_progress,
    )  # fmt: skip
    # fit calibrated the temperature (on the validation rows, or through its refit)
    temperature = float(model.temperature)
    mean, var = model.predict(likelihood, split.test_x.to(config.device))
    info = {
        "temperature": temperature,
        "final_w2": result.history["w2"][-1],
        "best_epoch": result.best_step,
        "epochs": epochs,
        "noise": float(likelihood.noise.detach()),
        "fit_problems": list(model.prior_fit_result.problems) + list(result.problems),
    }
    return Prediction(mean=mean.cpu(), variance=var.cpu(), info=info)


@register_method(
    "gwi_robustmax",
    task="classification",
    description="GWI with the robust-max likelihood (CNN mean on images, MLP otherwise)",
)
def fit_gwi_classification(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Fit :class:`GWIClassificationModel` and predict tempered robust-max probabilities.

    Images of side >= 16 (MNIST) get a :class:`gpext.nn.SmallCNN` mean trained for 10 / 15
    epochs (quick / full; Adam, lr 1e-3, batches of 128); other inputs an MLP mean.  The prior
    kernel is rescaled to unit variance (``prior_outputscale=1``): robust max is invariant to
    the latent scale, and with the scale fitted on one-hot labels (about 0.1) the outputs of
    misclassified points soon sit many latent standard deviations past the winning class,
    where the expected log-likelihood is flat and training stalls.
    """
    gen = torch.Generator().manual_seed(config.seed)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    xt, yt, xv, yv = validation_split(x, y, 0.1, gen)
    image = getattr(split, "image_shape", None)
    if image is not None and image[-1] < 16:  # 8x8 digits: the MLP mean does better than a CNN
        image = None
    model, likelihood = GWIClassificationModel.from_data(
        xt, yt, int(split.num_classes), image_shape=image, prior_points=config.budget(500, 1000),
        prior_steps=config.budget(30, 60), generator=gen, show_progress=config.show_progress,
    )  # fmt: skip
    if image is not None:
        epochs, lr = config.budget(10, 15), 1e-3
    else:
        epochs, lr = config.budget(40, 60), 1e-2
    model.fit(
        likelihood, xt, yt, epochs=epochs, batch_size=128, lr=lr, x_val=xv, y_val=yv,
        eval_every=max(1, epochs // 25), generator=gen, show_progress=config.show_progress,
    )  # fmt: skip
    temperature = model.calibrate_temperature(likelihood, xv, yv)
    probs = model.predict_proba(likelihood, split.test_x.to(config.device))
    return Prediction(probs=probs.cpu(), info={"temperature": temperature})
