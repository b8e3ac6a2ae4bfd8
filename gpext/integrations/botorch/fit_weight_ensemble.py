"""Train a network and a weight posterior (SWAG, MultiSWAG, PCA subspace + ESS / VI) for BoTorch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS
from gpext.integrations.botorch._checks import check_query
from gpext.integrations.botorch.weight_ensemble_surrogate import WeightEnsembleSurrogate
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    SWAG,
    MultiSWAG,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    train_sgd_trajectory,
)
from gpext.utils import check_positive_int

__all__ = ["fit_weight_ensemble"]

METHODS = ("swag", "multiswag", "pca_ess", "pca_vi")


def _new_network(d: int, hidden: Sequence[int], dtype, generator) -> HeteroscedasticMLP:
    seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return HeteroscedasticMLP(d, tuple(hidden)).to(dtype)


def fit_weight_ensemble(
    train_X: torch.Tensor,
    train_Y: torch.Tensor,
    *,
    method: str = "swag",
    num_samples: int = 16,
    hidden_features: Sequence[int] = (50,),
    epochs: int = 200,
    swa_epochs: int = 50,
    lr: float = 1e-2,
    weight_decay: float = 1e-3,
    batch_size: int | None = None,
    rank: int = 10,
    num_components: int = 3,
    validation_fraction: float | None = None,
    input_transform: torch.nn.Module | None = None,
    outcome_transform: torch.nn.Module | None = None,
    generator: torch.Generator | None = None,
) -> WeightEnsembleSurrogate:
    r"""Train a heteroscedastic MLP by SGD, build a weight posterior, return a BoTorch surrogate.

    The protocol is the small-UCI one of 000 Sec. IV-B: a
    :class:`~gpext.nn.HeteroscedasticMLP`, SGD with momentum on the mean negative log-likelihood
    (plus weight decay) for ``epochs`` epochs, weights collected once per epoch over the last
    ``swa_epochs`` (at most 20 deviations), then

    * ``"swag"``: SWAG (diagonal + low rank, scale 0.5), ``num_samples`` draws;
    * ``"multiswag"``: ``num_components`` independent SWAG runs, ``num_samples`` draws each;
    * ``"pca_ess"`` / ``"pca_vi"``: the rank-``rank`` PCA subspace of the deviations around
      the SWA mean, :math:`w = \bar w + P^\top\theta`, with ``num_samples`` elliptical slice
      samples / samples of a mean-field VI fit of the tempered posterior (prior standard
      deviation 1).  The temperature is drbayes's ``n / rank`` unless there is a hold-out:
      then the network is trained on the other rows and the temperature chosen on the
      hold-out by :meth:`~gpext.subspace.SubspaceModel.select_temperature` (ESS over
      ``(n / rank)^e``, ``e`` from -1 to 2 in steps of 0.5; ``"pca_vi"`` reuses that choice).

    Args:
        train_X: Inputs. # shape: (n, d)
        train_Y: One regression target. # shape: (n, 1)
        method: One of ``"swag"``, ``"multiswag"``, ``"pca_ess"``, ``"pca_vi"``.
        num_samples: Ensemble size (per component for MultiSWAG).
        hidden_features: Hidden widths of the MLP.
        epochs: SGD epochs in all.
        swa_epochs: Collection epochs at the end (``< epochs``).
        lr: Initial SGD learning rate.
        weight_decay: SGD weight decay.
        batch_size: Mini-batch size (default ``ceil(n / 10)``).
        rank: Subspace rank (``pca_*``).
        num_components: MultiSWAG components.
        validation_fraction: Hold-out for the temperature of the ``pca_*`` methods, in
            ``[0, 0.5]``.  ``None`` (default): 0.1 when ``n >= 200``, else 0 (small designs
            keep every row).  On the small UCI sets of ``benchmarks/robustness.py`` (boston,
            concrete) ``n / rank`` left 84-92% of the test points inside the 95% intervals.
        input_transform: BoTorch ``InputTransform``, learned on ``train_X`` (train mode) and
            applied to the queries.
        outcome_transform: BoTorch ``OutcomeTransform``, fitted to ``train_Y``.
        generator: Random generator (initial weights, mini-batches, samples).

    Returns:
        A :class:`WeightEnsembleSurrogate` in eval mode.

    Raises:
        InputDataError: On an unknown ``method`` or ``swa_epochs >= epochs``.
        ShapeError: If ``train_Y`` is not ``(n, 1)``.

    Example:
        >>> import torch
        >>> from botorch.acquisition import qUpperConfidenceBound
        >>> from botorch.models.transforms import Standardize
        >>> from gpext.integrations.botorch import fit_weight_ensemble
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> model = fit_weight_ensemble(X, Y, method="pca_ess", outcome_transform=Standardize(1))
        >>> qUpperConfidenceBound(model, beta=4.0)(torch.rand(8, 2, X.shape[-1], dtype=X.dtype)).shape
        torch.Size([8])
    """
    if method not in METHODS:
        raise InputDataError(
            expected_got("fit_weight_ensemble.method", f"one of {METHODS}", method)
        )
    check_query(train_X, None, None, "fit_weight_ensemble.train_X")
    if train_X.dim() != 2 or train_Y.dim() != 2 or train_Y.shape != (train_X.shape[0], 1):
        raise ShapeError(
            expected_got(
                "fit_weight_ensemble(train_X, train_Y)",
                "train_X (n, d) and train_Y (n, 1)",
                f"{tuple(train_X.shape)} and {tuple(train_Y.shape)}",
            )
        )
    epochs = check_positive_int(epochs, "fit_weight_ensemble.epochs", minimum=2)
    swa_epochs = check_positive_int(swa_epochs, "fit_weight_ensemble.swa_epochs", minimum=2)
    if swa_epochs >= epochs:
        raise InputDataError(
            expected_got("fit_weight_ensemble.swa_epochs", f"< epochs = {epochs}", swa_epochs)
        )
    num_samples = check_positive_int(num_samples, "fit_weight_ensemble.num_samples")
    x = train_X
    if input_transform is not None:
        input_transform.train()
        with torch.no_grad():
            x = input_transform(train_X)
        input_transform.eval()
    y = train_Y
    if outcome_transform is not None:
        outcome_transform.train()
        y, _ = outcome_transform(train_Y, X=train_X)
        outcome_transform.eval()
    y = y.squeeze(-1).detach()
    n, d = x.shape
    if validation_fraction is None:
        auto = n >= AUTO_VALIDATION_MIN_POINTS and method.startswith("pca")
        validation_fraction = 0.1 if auto else 0.0
    if not (isinstance(validation_fraction, (int, float)) and 0 <= validation_fraction <= 0.5):
        raise InputDataError(
            expected_got("fit_weight_ensemble.validation_fraction", "a number in [0, 0.5] or None",
                         validation_fraction)
        )  # fmt: skip
    n_val = int(round(validation_fraction * n)) if method.startswith("pca") else 0
    x_val = y_val = None
    if n_val > 0:
        perm = torch.randperm(n, generator=generator).to(x.device)
        x_val, y_val, x, y = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
        n = x.shape[0]
    likelihood = OutputLikelihood("heteroscedastic_gaussian", min_variance=1e-6)
    runs = num_components if method == "multiswag" else 1
    swags, net, traj = [], None, None
    for _ in range(check_positive_int(runs, "fit_weight_ensemble.num_components")):
        net = _new_network(d, hidden_features, x.dtype, generator)
        traj = train_sgd_trajectory(
            net, x, y, likelihood, epochs=epochs, swa_start=epochs - swa_epochs, lr=lr,
            weight_decay=weight_decay, batch_size=batch_size, max_deviations=20,
            generator=generator,
        )  # fmt: skip
        swags.append(SWAG.from_trajectory(traj))
    kw = {
        "input_dim": d,
        "input_transform": input_transform,
        "outcome_transform": outcome_transform,
    }
    if method in ("swag", "multiswag"):
        post = swags[0] if method == "swag" else MultiSWAG(swags)
        return WeightEnsembleSurrogate.from_swag(
            net, post, num_samples, likelihood=likelihood, generator=generator, **kw
        )
    devs = traj.deviations()
    pca = PCASubspace(min(rank, devs.shape[0] - 1)).fit(devs, generator=generator)
    sub = SubspaceModel(net, traj.mean, pca.projection, likelihood, temperature=n / pca.rank)
    thetas = None
    if x_val is not None:
        _, thetas, _ = sub.select_temperature(
            x, y, x_val, y_val, num_samples=num_samples, burn_in=num_samples, generator=generator
        )
    if method == "pca_ess":
        if thetas is None:
            thetas = sub.sample_ess(x, y, num_samples, burn_in=num_samples, generator=generator)
            sub.check_fit(x, y, thetas)
    else:
        sub.fit_vi(x, y, num_steps=300, generator=generator)
        thetas = sub.sample_vi(num_samples, generator=generator)
    return WeightEnsembleSurrogate.from_subspace(sub, thetas, **kw)
