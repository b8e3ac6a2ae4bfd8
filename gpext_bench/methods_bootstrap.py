"""Variational-bootstrap methods (001) registered in ``gpext bench``.

* ``vboot_rff_dirichlet`` / ``vboot_rff``: :class:`~gpext.bootstrap.VBootRFF`, closed-form
  particles on random Fourier features (full: 5000 features, 50 particles as in 001 Sec. 5;
  quick: 1000 features, 20 particles), hyperparameters fitted once on a subset.
* ``vboot_mlp_dirichlet`` / ``vboot_mlp``: :class:`~gpext.bootstrap.VBootMLP`, 10 particles of a
  2 x 512 ReLU MLP trained as one vectorised ensemble (quick: 2 x 128, 5 particles); Adam with
  ``lr = 0.1`` (NTK parameterisation, see :meth:`~gpext.bootstrap.VBootMLP.fit`), batch 256,
  cosine decay, 12 epochs in the full budget (001 trains 200; 12 is what a 2-core CPU affords).
  The ensemble is float32 whatever ``--dtype`` is; its inputs are converted to float32 and its
  predictions back to the split's dtype.

Classification uses the Dirichlet transform with ``alpha_epsilon = 0.01``, or ``0.001`` for more
than ten classes (the setting of the reference code for letter-like data sets).
"""

from __future__ import annotations

import time

import torch

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = ["default_alpha_epsilon", "fit_predict_vboot_mlp", "fit_predict_vboot_rff"]


def default_alpha_epsilon(num_classes: int) -> float:
    """``0.01`` for up to ten classes, ``0.001`` beyond (many-class sets such as letter)."""
    return 0.01 if num_classes <= 10 else 0.001


def _prediction(
    model, split: DatasetSplit, device, info: dict, dtype: torch.dtype | None = None
) -> Prediction:
    """Predict the split's test part; ``dtype``: the model's dtype when it differs from the
    split's (the test inputs are converted to it, as gpext models refuse inputs of another
    floating dtype, and the predictions back to the split's dtype for scoring)."""
    test_x = split.test_x.to(device, dtype or split.test_x.dtype)
    out_dtype = split.test_x.dtype
    if split.task == "classification":
        return Prediction(probs=model.predict_proba(test_x).to(torch.float64).cpu(), info=info)
    means, variances = model.predict_mixture(test_x)
    return Prediction(
        mixture_means=means.to(out_dtype).cpu(),
        mixture_variances=variances.to(out_dtype).cpu(),
        info=info,
    )


def fit_predict_vboot_rff(
    split: DatasetSplit,
    config: BenchConfig,
    *,
    num_features: int | None = None,
    num_particles: int | None = None,
    hyper_num_points: int | None = None,
    alpha_epsilon: float | None = None,
) -> Prediction:
    """Fit :class:`~gpext.bootstrap.VBootRFF` on the split and predict its test part.

    Args:
        split: The data split.
        config: Benchmark settings (quick/full budget, seed, dtype, device).
        num_features: Random features (default 1000 quick / 5000 full).
        num_particles: Particles per output (default 20 quick / 50 full).
        hyper_num_points: Subset for the hyperparameter fit (default 500 quick / 1000 full).
        alpha_epsilon: Dirichlet ``alpha_epsilon`` (default :func:`default_alpha_epsilon`).

    Returns:
        Class probabilities or a Gaussian mixture; ``info`` holds the timings of the
        hyperparameter fit and of the particle solve.
    """
    gen = torch.Generator().manual_seed(config.seed)
    x = split.train_x.to(config.device, config.dtype)
    kwargs = dict(
        num_features=num_features or config.budget(1000, 5000),
        num_particles=num_particles or config.budget(20, 50),
        hyper_num_points=hyper_num_points or config.budget(500, 1000),
    )
    if split.task == "classification":
        eps = alpha_epsilon or default_alpha_epsilon(int(split.num_classes))
        model = VBootRFF(
            task="classification", num_classes=split.num_classes, alpha_epsilon=eps, **kwargs
        )
    else:
        model = VBootRFF(task="regression", **kwargs)
    t0 = time.perf_counter()
    model.fit(x, split.train_y.to(config.device), generator=gen, show_progress=config.show_progress)
    info = {"fit_seconds": time.perf_counter() - t0, **kwargs}
    return _prediction(model, split, config.device, info)


def fit_predict_vboot_mlp(
    split: DatasetSplit,
    config: BenchConfig,
    *,
    num_particles: int | None = None,
    hidden_sizes: tuple[int, ...] | None = None,
    num_epochs: int | None = None,
    min_steps: int | None = None,
    batch_size: int | None = None,
    lr: float = 0.1,
    alpha_epsilon: float | None = None,
    dtype: torch.dtype = torch.float32,
) -> Prediction:
    """Fit :class:`~gpext.bootstrap.VBootMLP` on the split and predict its test part.

    Args:
        split: The data split.
        config: Benchmark settings.
        num_particles: Particles (default 5 quick / 10 full).
        hidden_sizes: Hidden widths (default ``(128, 128)`` quick / ``(512, 512)`` full).
        num_epochs: Epochs (default 10 quick / 12 full); Adam with cosine decay.
        min_steps: Raise the epochs so that at least this many Adam steps are taken (default
            300 quick / 600 full; matters for small data sets).
        batch_size: Minibatch size (default ``min(256, max(32, N // 8))``).
        lr: Initial Adam learning rate (``0.1`` suits the NTK parameterisation).
        alpha_epsilon: Dirichlet ``alpha_epsilon`` (default :func:`default_alpha_epsilon`).
        dtype: Dtype of the ensemble (float32: the usual precision for networks, also under
            ``--dtype float64``). The training and test inputs are converted to it, and the
            predictions back to the split's dtype, so any split dtype works.

    Returns:
        Class probabilities or a Gaussian mixture.
    """
    x = split.train_x.to(config.device, dtype)
    kwargs = dict(
        num_particles=num_particles or config.budget(5, 10),
        hidden_sizes=hidden_sizes or config.budget((128, 128), (512, 512)),
        seed=config.seed,
        dtype=dtype,
    )
    if split.task == "classification":
        eps = alpha_epsilon or default_alpha_epsilon(int(split.num_classes))
        model = VBootMLP(
            task="classification", num_classes=split.num_classes, alpha_epsilon=eps, **kwargs
        )
    else:
        model = VBootMLP(task="regression", **kwargs)
    n = x.shape[0]
    batch_size = batch_size or min(256, max(32, n // 8))
    epochs = num_epochs or config.budget(10, 12)
    steps_per_epoch = max(1, n // min(batch_size, n))
    min_steps = config.budget(300, 600) if min_steps is None else min_steps
    epochs = max(epochs, -(-min_steps // steps_per_epoch))
    t0 = time.perf_counter()
    y = split.train_y.to(config.device)
    if split.task == "regression":
        y = y.to(dtype)
    model.fit(
        x, y, num_epochs=epochs, batch_size=batch_size, lr=lr,
        cosine_decay=True, show_progress=config.show_progress,
    )  # fmt: skip
    info = {
        "fit_seconds": time.perf_counter() - t0,
        "num_epochs": epochs,
        "batch_size": batch_size,
        **kwargs,
    }
    info["dtype"] = str(dtype)
    return _prediction(model, split, config.device, info, dtype=dtype)


@register_method(
    "vboot_rff_dirichlet",
    task="classification",
    description="Variational bootstrap, RFF (closed form), Dirichlet transform (001)",
)
def _vboot_rff_classification(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """VBootRFF classifier with the default budget."""
    return fit_predict_vboot_rff(split, config)


@register_method(
    "vboot_rff",
    task="regression",
    description="Variational bootstrap, RFF (closed form), Gaussian likelihood (001)",
)
def _vboot_rff_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """VBootRFF regressor with the default budget."""
    return fit_predict_vboot_rff(split, config)


@register_method(
    "vboot_mlp_dirichlet",
    task="classification",
    description="Variational bootstrap, vectorised NTK MLP ensemble, Dirichlet transform (001)",
    default=False,
)
def _vboot_mlp_classification(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """VBootMLP classifier with the default budget."""
    return fit_predict_vboot_mlp(split, config)


@register_method(
    "vboot_mlp",
    task="regression",
    description="Variational bootstrap, vectorised NTK MLP ensemble, Gaussian likelihood (001)",
    default=False,
)
def _vboot_mlp_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """VBootMLP regressor with the default budget."""
    return fit_predict_vboot_mlp(split, config)
