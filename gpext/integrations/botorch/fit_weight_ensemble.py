"""Train a network and a weight posterior (SWAG, MultiSWAG, PCA subspace + ESS / VI, Bayesian last
layer) for BoTorch, with the likelihood, recipe, SWAG scale and temperature validated on a
hold-out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS
from gpext.integrations.botorch._checks import check_query
from gpext.integrations.botorch.prior_reversion import attach_prior_reversion
from gpext.integrations.botorch.variance_calibration import cross_validated_variance_scale
from gpext.integrations.botorch.weight_ensemble_surrogate import WeightEnsembleSurrogate
from gpext.nn import standardize_inputs
from gpext.subspace import (
    SWAG,
    BayesianLastLayer,
    FlatParameters,
    MultiSWAG,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    TrainingRecipe,
    predict_weight_samples,
    regression_network,
    select_noise_variance,
    select_swag_scale,
    validation_log_likelihood,
)
from gpext.utils import check_learning_rate, check_positive_int

__all__ = ["fit_weight_ensemble"]

METHODS = ("swag", "multiswag", "pca_ess", "pca_vi", "last_layer")
LIKELIHOODS = ("auto", "homoscedastic", "heteroscedastic")
#: Gradient-norm clipping of the homoscedastic network's training (as the benchmark's).
MAX_GRAD_NORM = 10.0
_KINDS = {"homoscedastic": "homoscedastic_gaussian", "heteroscedastic": "heteroscedastic_gaussian"}
#: ``"last_layer"``: floor on the learned noise used when the evidence chose pure noise,
#: relative to the targets' variance.
_MIN_NOISE_FRACTION = 1e-6


def _new_network(kind: str, d: int, hidden: Sequence[int], like: torch.Tensor, generator,
                 normalized: bool = False) -> torch.nn.Module:  # fmt: skip
    """A fresh network on ``like``'s device and dtype (its initialisation drawn on the CPU,
    so that a seed gives the same network on every device)."""
    seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = regression_network(kind, d, tuple(hidden), normalize_last_hidden=normalized)
    return net.to(device=like.device, dtype=like.dtype)


def _train(kind, recipe, x, y, hidden, generator, normalized=False, standardize=True):
    """One network of ``kind`` trained with ``recipe``: ``(net, trajectory, likelihood)``.

    ``standardize`` (``True``, ``False``, ``"inputs"``, ``"targets"``): the data contract.  The
    network maps its inputs to the unit cube of the design
    (:func:`gpext.nn.standardize_inputs` with ``kind="unit_cube"``, BoTorch's ``Normalize``
    learned on the data: the setting the recipe was validated in), and the likelihood maps its
    outputs to the targets' units (:func:`~gpext.subspace.train_sgd_trajectory`)."""
    likelihood = OutputLikelihood(kind, min_variance=1e-6)
    net = _new_network(kind, x.shape[-1], hidden, x, generator, normalized)
    if standardize in (True, "inputs"):
        standardize_inputs(net, x, kind="unit_cube", name="fit_weight_ensemble")
    # learned noise scales the mean's gradient by 1 / sigma^2 as sigma^2 shrinks: clip it
    clip = MAX_GRAD_NORM if likelihood.learns_noise else None
    targets = "targets" if standardize in (True, "targets") else False
    traj = recipe.train(net, x, y, likelihood, max_deviations=20, max_grad_norm=clip,
                        generator=generator, standardize=targets)  # fmt: skip
    return net, traj, likelihood


def _gaussian_like(lik: OutputLikelihood, noise: float) -> OutputLikelihood:
    """A fixed-noise Gaussian likelihood (standardised ``noise``) with ``lik``'s target transform."""
    out = OutputLikelihood("gaussian")
    if lik.has_target_transform:
        out.set_target_transform(lik.target_loc, lik.target_scale)
    out.noise_variance = float(noise)  # standardised, as the last layer's evidence
    return out


def _evidence_last_layer(net, center, x, y, lik) -> tuple[BayesianLastLayer, str]:
    """The last layer's posterior at the body ``center``, precisions by the evidence; where
    the evidence chose pure noise, the noise fixed at the one the network learned.  Fitted on
    the targets in the network's (standardised) units, as its last layer was trained."""
    FlatParameters(net).assign(center)
    t = lik.transform_targets(y)
    bll = BayesianLastLayer(net).fit(x, t)  # warns if the evidence chose pure noise
    if not bool(bll.collapsed):
        return bll, "evidence"
    noise = max(lik.noise_variance, _MIN_NOISE_FRACTION * float(t.var()))
    bll = BayesianLastLayer(net, noise_precision=1.0 / noise).fit(x, t)
    return bll, "network (the evidence chose pure noise)"


def _conditional_last_layers(net, centers, blocks, x, y, lik, generator, selection):
    """Every block's last layers redrawn given their bodies
    (:meth:`~gpext.subspace.BayesianLastLayer.sample_conditional`), at the evidence's
    precisions of the block's centre; the Gaussian likelihood of the mean noise."""
    out, noises, alphas, how = [], [], [], []
    for center, block in zip(centers, blocks):
        bll, source = _evidence_last_layer(net, center, x, y, lik)
        out.append(bll.sample_conditional(block, x, lik.transform_targets(y), generator=generator))
        noises.append(bll.noise_variance)
        alphas.append(float(bll.prior_precision))
        how.append(source)
    selection["last_layer_noise"] = how[0] if len(how) == 1 else how
    selection["prior_precision"] = alphas[0] if len(alphas) == 1 else alphas
    noise = sum(noises) / len(noises)
    return torch.cat(out), _gaussian_like(lik, noise)


def _swag_score(net, swag, likelihood, x_val, y_val, swag_scale, num_samples, generator):
    """``(held-out score, scale)``: the tuned scale, or the fixed one."""
    if swag_scale == "auto":
        sel = select_swag_scale(net, swag, x_val, y_val, likelihood, num_samples=num_samples,
                                generator=generator)  # fmt: skip
        return sel.scores[sel.value], sel.value
    if likelihood.learns_noise:  # the noise is tuned on the hold-out at the fixed scale
        w = swag.sample(num_samples, scale=swag_scale, generator=generator)
        sel = select_noise_variance(net, w, x_val, y_val, likelihood)
        return sel.scores[sel.value], swag_scale
    w = swag.sample(num_samples, scale=swag_scale, generator=generator)
    pred = predict_weight_samples(net, w, x_val, likelihood)
    return validation_log_likelihood(pred, y_val), swag_scale


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
    likelihood: str = "auto",
    swag_scale: float | str = "auto",
    recipes: Mapping[str, TrainingRecipe] | None = None,
    input_transform: torch.nn.Module | None = None,
    outcome_transform: torch.nn.Module | None = None,
    generator: torch.Generator | None = None,
    calibrate: bool | None = None,
    calibration_folds: int = 5,
    bayesian_last_layer: bool | None = None,
    normalize_last_hidden: bool | None = None,
    prior_reversion: bool = True,
    standardize: bool | str | None = None,
) -> WeightEnsembleSurrogate:
    r"""Train an MLP by SGD, build a weight posterior, return a BoTorch surrogate.

    The protocol is the small-UCI one of 000 Sec. IV-B: an MLP with a Gaussian output, SGD
    with momentum on the mean negative log-likelihood (plus weight decay) for ``epochs``
    epochs, weights collected once per epoch over the last ``swa_epochs`` (at most 20
    deviations; the :class:`~gpext.subspace.TrainingRecipe`
    ``TrainingRecipe(epochs, batch_size, lr, weight_decay, epochs - swa_epochs, lr / 2)``),
    then

    * ``"swag"``: SWAG (diagonal + low rank, covariance scale ``swag_scale``),
      ``num_samples`` draws;
    * ``"multiswag"``: ``num_components`` independent SWAG runs, ``num_samples`` draws each;
    * ``"pca_ess"`` / ``"pca_vi"``: the rank-``rank`` PCA subspace of the deviations around
      the SWA mean, :math:`w = \bar w + P^\top\theta`, with ``num_samples`` elliptical slice
      samples / samples of a mean-field VI fit of the tempered posterior (prior standard
      deviation 1).  The temperature is drbayes's ``n / rank`` unless there is a hold-out:
      then it is chosen on the hold-out by
      :meth:`~gpext.subspace.SubspaceModel.select_temperature` (ESS over ``(n / rank)^e``,
      ``e`` from -1 to 2 in steps of 0.5, with the predictive variance scale calibrated;
      ``"pca_vi"`` reuses that choice);
    * ``"last_layer"``: the network at its SWA mean with the exact Gaussian posterior of its
      last linear layer, prior and noise precisions by the evidence
      (:class:`~gpext.subspace.BayesianLastLayer`, DNGO's surrogate), ``num_samples`` draws
      of the last layer; the homoscedastic network only.  Where the evidence explains the
      targets as noise (a :class:`~gpext.errors.VarianceCollapseWarning`; 1 of 36 Branin
      designs of 5-24 points, with 5), the noise precision is fixed at the noise the
      network learned and only the prior precision is tuned
      (``fit_selection["last_layer_noise"]``).

    The validated recipe (issue 18, 22). With a hold-out (by default from ``n >= 200`` rows,
    for every method) the network is trained on the other rows and chosen on the hold-out,
    by the mean held-out log predictive density of its SWAG posterior
    (:func:`~gpext.subspace.validation_log_likelihood`):

    * the output likelihood (``likelihood="auto"``): a homoscedastic network
      (:class:`~gpext.nn.MLP`, one output, noise learned:
      ``OutputLikelihood("homoscedastic_gaussian")``, gradients clipped to norm
      :data:`MAX_GRAD_NORM`) or a heteroscedastic one
      (:class:`~gpext.nn.HeteroscedasticMLP`), as :func:`~gpext.subspace.select_likelihood`
      does;
    * the training recipe, when ``recipes`` names several
      (as :func:`~gpext.subspace.select_recipe` does; e.g.
      ``gpext.subspace.recipe_candidates(name)``,
      the search of ``benchmarks/subspace_uci.py``);
    * the SWAG covariance scale (``swag_scale="auto"``,
      :func:`~gpext.subspace.select_swag_scale`, after the noise of a homoscedastic network,
      chosen at the SWA mean; the customary 0.5 is too wide on energy and yacht);
    * the temperature of the ``pca_*`` methods, as above.

    Each candidate costs one training run; the scoring costs forward passes on the hold-out
    only. Without a hold-out (small designs, the 5-50 points of a BO loop) nothing is chosen:
    the homoscedastic network (``likelihood="auto"``), the first recipe, scale 0.5, and for
    the ``pca_*`` methods :math:`T = n / r`; the network keeps the noise it learned on its
    training rows (its maximum-likelihood value at the SWA mean).  A heteroscedastic network
    can explain a few points as noise instead of fitting them: on the 5-24 points of
    ``benchmarks/bo.py``'s ``exp2d`` runs (seeds 0-4, 20 iterations each) it ended with
    :math:`R^2 < 0.1` on its own training targets
    (:class:`~gpext.errors.VarianceCollapseWarning`) in 37 of 100 SWAG fits and 45 of 100
    PCA + ESS fits, the homoscedastic network in none.

    Calibration of small designs (``calibrate``; by default exactly when there is no
    hold-out): networks fitted to a few points were overconfident in Bayesian optimisation
    (Hartmann-6, 20 points: 2-8% of held-out values inside the 90% intervals of SWAG and the
    PCA-subspace ensembles).  The whole procedure is repeated on ``calibration_folds - 1``
    folds per fold, and the members' spread about their mean is multiplied by the held-out
    maximum-likelihood factor :math:`\kappa \ge 1` on the variance
    (:func:`~gpext.integrations.botorch.cross_validated_variance_scale`; ``fit_selection
    ["epistemic_scale"]``, ``model.variance_calibration``).  It costs ``calibration_folds``
    extra fits.  A calibrated regression ensemble is also combined with its outcome's prior
    (``prior_reversion``, default on; a :class:`~gpext.integrations.botorch.PriorReversion`,
    with :math:`\kappa` chosen for the combination; ``fit_selection["prior_reversion"]``):
    where the members disagree more than the targets vary, their mean reverts to the targets'
    mean and their spread saturates at the targets' spread, as a GP's does.  On Hartmann-6
    with 10 points the calibrated Bayesian last layer's sd at the corners of the cube
    reached 12 times the targets' (6.2 against 0.52), so expected improvement kept choosing
    corners.

    Conditional Bayesian last layer of small designs (``bayesian_last_layer``; by default
    exactly when there is no hold-out and the network is homoscedastic).  The calibration
    scales the spread uniformly; it does not make it grow away from the data.  SGD explores
    only the directions the data constrain, so the trajectory subspaces and SWAG hold no
    variance for the rest: measured on Branin with 12 scrambled-Sobol points (seeds 0-2,
    512 uniform test points), the correlation between the posterior sd and the distance to
    the nearest training point was -0.12 to 0.12 for SWAG, -0.13 to 0.10 for PCA + ESS and
    -0.07 to 0.23 for MultiSWAG (``SingleTaskGP``: 0.80-0.84), while the correlation with
    the distance to the box centre was 0.36-0.66: the members disagreed most towards the
    corners, where the ReLU network extrapolates linearly, not in the gaps between the
    points.  In early ``benchmarks/bo.py`` runs without these defaults (kept in
    ``benchmarks/results/partial``) these methods then did not beat random search (Branin,
    seeds 0-4, final regret 3.7 for PCA + ESS and 4.2 for SWAG against 3.1; the 10-seed runs
    with the defaults are in ``benchmarks/results/bo.md``).  With the conditional last layer every
    member's body :math:`b_s` is the method's draw and its last layer a draw of the exact
    Gaussian posterior given that body,

    .. math::

        w_s^{\text{last}} \sim \mathcal N(m_s, S_s), \qquad
        S_s^{-1} = \alpha I + \beta\,\Phi_s^\top\Phi_s, \qquad
        m_s = \beta S_s \Phi_s^\top y, \qquad \Phi_s = \phi(X; b_s),

    (:meth:`~gpext.subspace.BayesianLastLayer.sample_conditional`), with :math:`\alpha,
    \beta` from the evidence at the SWA mean (per component for MultiSWAG; where it chose
    pure noise, :math:`\beta` is the network's learned noise as for ``"last_layer"``) and
    the observation noise :math:`\beta^{-1}` (the components' mean).  The ensemble then
    samples :math:`q(b)\,p(w^{\text{last}} \mid b, \mathcal D)`: the prior variance
    :math:`\alpha^{-1}` stays in the directions the body's training features do not span.
    On the same Branin designs (seeds 0-1, before calibration, ReLU features without
    the normalisation below) the correlation rose to
    0.42-0.43 (SWAG), 0.47-0.49 (MultiSWAG), 0.44-0.47 (PCA + ESS) and 0.51-0.53
    (PCA + VI), from -0.13 to 0.21, with the normalised RMSE unchanged (0.45-0.57); after the
    calibration (seeds 0-2) the 90% coverage was 0.73-1.00.  ``"last_layer"`` is the same
    posterior with one body, the SWA mean: correlation 0.38-0.56 there.  With a hold-out
    (``n >= 200`` by default) the conditional last layer is off unless asked for: the
    validated recipe was measured without it (issue 22).

    Unit-norm features under a Bayesian last layer (``normalize_last_hidden``; by default
    wherever the last layer is Bayesian).  With ReLU features :math:`h(x)` the prior
    variance of :math:`f(x) = w^\top [h(x), 1]`, :math:`\alpha^{-1}(\lVert h(x)\rVert^2 +
    1)`, grows without bound towards the corners of the box, and so did the calibrated
    spread and the network's extrapolated mean: on Hartmann-6 (10-15 points) the LogEI
    candidates of SWAG and ``"last_layer"`` had 4-6 of their 6 coordinates on the bounds
    and the cross-validated factor reached its cap of :math:`10^4`.  (DNGO, Snoek et al.
    2015, reports the same of unbounded ReLU basis functions.)  The network is therefore
    trained with its last hidden layer scaled to unit norm (:class:`~gpext.nn.UnitNorm`,
    ``MLP(normalize_last_hidden=True)``), which makes the prior variance the same everywhere,
    as a stationary kernel's is.  Measured in ``benchmarks/bo.py``'s Hartmann-6 runs of
    ``swag`` (seeds 0-4, 20 iterations): final regret 0.47, 2.46, 1.74, 0.97, 0.57 with
    unit-norm features against 1.38, 2.76, 1.74, 2.63, 2.29 without (random search on
    seeds 0-3: 1.60, 2.00, 1.74, 1.40); on Branin-12 (seeds 0-2, calibrated)
    the correlation of the sd with the distance to the data was 0.26-0.50 against
    0.38-0.56, and the normalised RMSE 0.42-0.64 against 0.40-0.57 (SWAG and
    ``"last_layer"``): a little less distance-aware in two dimensions, no longer drawn to
    the corners in six.

    Args:
        train_X: Inputs. # shape: (n, d)
        train_Y: One regression target. # shape: (n, 1)
        method: One of ``"swag"``, ``"multiswag"``, ``"pca_ess"``, ``"pca_vi"``,
            ``"last_layer"``.
        num_samples: Ensemble size (per component for MultiSWAG).
        hidden_features: Hidden widths of the MLP.
        epochs: SGD epochs in all.
        swa_epochs: Collection epochs at the end (``< epochs``).
        lr: Initial SGD learning rate.
        weight_decay: SGD weight decay.
        batch_size: Mini-batch size (default ``ceil(n / 10)``).
        rank: Subspace rank (``pca_*``).
        num_components: MultiSWAG components.
        validation_fraction: Hold-out fraction in ``[0, 0.5]``.  ``None`` (default): 0.1 when
            ``n >= 200``, else 0 (small designs keep every row).  On the small UCI sets of
            ``benchmarks/robustness.py`` (boston, concrete) the ``pca_*`` temperature
            ``n / rank`` left 84-92% of the test points inside the 95% intervals.
        likelihood: ``"auto"`` (chosen on the hold-out; homoscedastic without one, and
            always for ``"last_layer"``), ``"homoscedastic"`` or ``"heteroscedastic"``.
        swag_scale: SWAG covariance scale (``swag``, ``multiswag``; ``pca_*`` use it only
            to score the likelihood and recipe candidates), or ``"auto"``: tuned on the
            hold-out, 0.5 without one.
        recipes: Named :class:`~gpext.subspace.TrainingRecipe` candidates (default: the one
            recipe of ``epochs``, ``swa_epochs``, ``lr``, ``weight_decay``, ``batch_size``).
        input_transform: BoTorch ``InputTransform``, learned on ``train_X`` (train mode) and
            applied to the queries.
        outcome_transform: BoTorch ``OutcomeTransform``, fitted to ``train_Y``.
        generator: Random generator (initial weights, mini-batches, samples).
        calibrate: Calibrate the ensemble's spread by cross-validation (``None``: when there
            is no hold-out).
        calibration_folds: Folds of the calibration (at most ``n``).
        bayesian_last_layer: Redraw every member's last layer from its exact posterior
            given the member's body (above; ``swag``, ``multiswag``, ``pca_*``; implies the
            homoscedastic network).  ``None`` (default): when there is no hold-out and the
            network is homoscedastic.  ``"last_layer"`` is this posterior at the SWA mean
            by construction.
        normalize_last_hidden: Train the network with its last hidden layer scaled to unit
            norm (above).  ``None`` (default): wherever the last layer is Bayesian
            (``"last_layer"``, or ``bayesian_last_layer``).
        prior_reversion: With calibration of a regression network, combine the calibrated
            ensemble with the outcome's prior (above); ``False``: the calibrated ensemble alone.
        standardize: The data contract (:func:`~gpext.subspace.train_sgd_trajectory`): every
            network maps its inputs to the unit cube of its training rows
            (:func:`gpext.nn.standardize_inputs` with ``kind="unit_cube"``, as BoTorch's
            ``Normalize`` learned on the data; the protocol above was measured on designs
            in the unit cube, where this is close to the identity) and its likelihood maps
            its outputs to the targets' units (a target transform fitted on the training
            targets), so the recipe's defaults hold whatever the units of ``train_X`` and
            ``train_Y``.  ``None`` (default): the inputs unless
            ``input_transform`` is given, the targets unless ``outcome_transform`` is given
            (a BoTorch ``Normalize`` / ``Standardize`` then does it, not twice).  ``True``,
            ``False`` (the data as given, after the BoTorch transforms), ``"inputs"`` or
            ``"targets"`` decide it.  The Bayesian last layers are fitted to the targets in
            the network's units, and ``fit_selection["noise_variance"]`` is in the
            targets' units (after ``outcome_transform``).

    Returns:
        A :class:`WeightEnsembleSurrogate` in eval mode. Its ``fit_selection`` dictionary
        says what was chosen: ``"likelihood"``, ``"recipe"``, ``"swag_scale"``,
        ``"temperature"`` (``pca_*``), ``"noise_variance"`` (homoscedastic; the evidence's
        for ``"last_layer"`` and the conditional last layer), ``"bayesian_last_layer"``
        (bool), ``"normalize_last_hidden"`` (bool), ``"prior_precision"`` and
        ``"last_layer_noise"`` (with a Bayesian last
        layer; lists of one entry per component for MultiSWAG), ``"log_evidence"``
        (``"last_layer"``), ``"scores"``
        (held-out score per ``(recipe, likelihood)`` candidate; empty without a hold-out),
        ``"epistemic_scale"`` (1 without calibration), ``"prior_reversion"`` (bool).

    Raises:
        InputDataError: On an unknown ``method`` or ``likelihood``, ``swa_epochs >= epochs``,
            a bad ``swag_scale`` or ``validation_fraction``, a ``bayesian_last_layer`` or
            ``normalize_last_hidden`` not ``None`` / bool, empty
            ``recipes``, or ``likelihood="heteroscedastic"`` with ``method="last_layer"`` or
            ``bayesian_last_layer=True``.
        ShapeError: If ``train_Y`` is not ``(n, 1)``.

    Example:
        >>> import torch
        >>> from botorch.acquisition import qUpperConfidenceBound
        >>> from botorch.models.transforms import Standardize
        >>> from gpext.integrations.botorch import fit_weight_ensemble
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> model = fit_weight_ensemble(X, Y, method="pca_ess", epochs=60, swa_epochs=20,
        ...                             outcome_transform=Standardize(1))
        >>> qUpperConfidenceBound(model, beta=4.0)(torch.rand(8, 2, X.shape[-1], dtype=X.dtype)).shape
        torch.Size([8])
    """
    if method not in METHODS:
        raise InputDataError(
            expected_got("fit_weight_ensemble.method", f"one of {METHODS}", method)
        )
    if likelihood not in LIKELIHOODS:
        raise InputDataError(
            expected_got("fit_weight_ensemble.likelihood", f"one of {LIKELIHOODS}", likelihood)
        )
    for name, value in (("bayesian_last_layer", bayesian_last_layer),
                        ("normalize_last_hidden", normalize_last_hidden)):  # fmt: skip
        if not (value is None or isinstance(value, bool)):
            raise InputDataError(
                expected_got(f"fit_weight_ensemble.{name}", "None, True or False", repr(value))
            )
    if bayesian_last_layer and likelihood == "heteroscedastic":
        raise InputDataError(
            expected_got("fit_weight_ensemble.likelihood", "'auto' or 'homoscedastic' with "
                         "bayesian_last_layer=True (one mean output)", likelihood)
        )  # fmt: skip
    if method == "last_layer" and likelihood == "heteroscedastic":
        raise InputDataError(
            expected_got("fit_weight_ensemble.likelihood", "'auto' or 'homoscedastic' with "
                         "method='last_layer' (one mean output)", likelihood)
        )  # fmt: skip
    if swag_scale != "auto" and not (
        isinstance(swag_scale, (int, float)) and math.isfinite(swag_scale) and swag_scale >= 0
    ):
        raise InputDataError(
            expected_got("fit_weight_ensemble.swag_scale", "'auto' or a number >= 0", swag_scale)
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
    lr = check_learning_rate(lr, "fit_weight_ensemble.lr")
    runs = check_positive_int(num_components if method == "multiswag" else 1,
                              "fit_weight_ensemble.num_components")  # fmt: skip
    if recipes is None:
        recipes = {"given": TrainingRecipe(epochs, batch_size, lr, weight_decay,
                                           epochs - swa_epochs, swa_lr=lr / 2)}  # fmt: skip
    recipes = dict(recipes)
    if not recipes or not all(isinstance(r, TrainingRecipe) for r in recipes.values()):
        raise InputDataError(
            expected_got("fit_weight_ensemble.recipes", "one or more TrainingRecipe", recipes)
        )
    if not (standardize is None or isinstance(standardize, bool)
            or standardize in ("inputs", "targets")):  # fmt: skip
        raise InputDataError(
            expected_got("fit_weight_ensemble.standardize",
                         "None, True, False, 'inputs' or 'targets'", repr(standardize))
        )  # fmt: skip
    if standardize is None:
        parts = (input_transform is None, outcome_transform is None)
        standardize = {(True, True): True, (True, False): "inputs",
                       (False, True): "targets", (False, False): False}[parts]  # fmt: skip
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
    n = x.shape[0]
    if validation_fraction is None:
        validation_fraction = 0.1 if n >= AUTO_VALIDATION_MIN_POINTS else 0.0
    if not (isinstance(validation_fraction, (int, float)) and 0 <= validation_fraction <= 0.5):
        raise InputDataError(
            expected_got("fit_weight_ensemble.validation_fraction", "a number in [0, 0.5] or None",
                         validation_fraction)
        )  # fmt: skip
    n_val = int(round(validation_fraction * n))
    x_val = y_val = None
    if n_val > 0:
        perm = torch.randperm(n, generator=generator).to(x.device)
        x_val, y_val, x, y = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
        n = x.shape[0]
    kinds = list(_KINDS) if likelihood == "auto" else [likelihood]
    if method == "last_layer" or bayesian_last_layer:
        kinds = ["homoscedastic"]
    if x_val is None:  # nothing to choose on: the first candidate, homoscedastic for "auto"
        kinds = ["homoscedastic"] if likelihood == "auto" else kinds
        recipes = dict([next(iter(recipes.items()))])
    if bayesian_last_layer is None:  # the small-design default (see the docstring)
        bayesian_last_layer = x_val is None and kinds == ["homoscedastic"]
    if normalize_last_hidden is None:
        normalize_last_hidden = bool(bayesian_last_layer) or method == "last_layer"
    scale = 0.5 if swag_scale == "auto" else float(swag_scale)
    scores: dict[tuple[str, str], float] = {}
    best = None
    for rname, recipe in recipes.items():
        for kind in kinds:
            net, traj, lik = _train(_KINDS[kind], recipe, x, y, hidden_features, generator,
                                    normalize_last_hidden, standardize)  # fmt: skip
            swag = SWAG.from_trajectory(traj)
            score, s = -math.inf, scale
            if x_val is not None:
                score, s = _swag_score(net, swag, lik, x_val, y_val, swag_scale,
                                       num_samples, generator)  # fmt: skip
                scores[(rname, kind)] = score
            if best is None or score > best[0]:
                best = (score, rname, kind, net, traj, lik, swag, s)
    if x_val is not None and not math.isfinite(best[0]):
        raise InputDataError(
            f"fit_weight_ensemble: every candidate gave a non-finite held-out log-likelihood "
            f"({scores}); check the data."
        )
    _, rname, kind, net, traj, lik, swag, scale = best
    selection = {"likelihood": kind, "recipe": rname, "swag_scale": scale, "scores": scores}
    conditional = bool(bayesian_last_layer) and method != "last_layer"
    selection["bayesian_last_layer"] = conditional or method == "last_layer"
    selection["normalize_last_hidden"] = bool(normalize_last_hidden)
    kw = {
        "input_dim": x.shape[-1],
        "input_transform": input_transform,
        "outcome_transform": outcome_transform,
    }
    if method in ("swag", "multiswag"):
        post = swag
        if method == "multiswag":
            swags = [swag] + [
                SWAG.from_trajectory(
                    _train(
                        _KINDS[kind],
                        recipes[rname],
                        x,
                        y,
                        hidden_features,
                        generator,
                        normalize_last_hidden,
                        standardize,
                    )[1]
                )  # fmt: skip
                for _ in range(runs - 1)
            ]
            post = MultiSWAG(swags)
            if x_val is not None and swag_scale == "auto":
                scale = select_swag_scale(net, post, x_val, y_val, lik, num_samples=num_samples,
                                          generator=generator).value  # fmt: skip
                selection["swag_scale"] = scale
        if conditional:
            components = post.components if method == "multiswag" else [swag]
            total = num_samples * len(components)
            counts = post.allocation(total) if method == "multiswag" else [total]
            w = post.sample(total, scale=scale, generator=generator)
            w, lik = _conditional_last_layers(
                net, [c.posterior_mean for c in components], w.split(counts), x, y, lik,
                generator, selection,
            )  # fmt: skip
            model = WeightEnsembleSurrogate(net, w, likelihood=lik, **kw)
        else:
            model = WeightEnsembleSurrogate.from_swag(
                net, post, num_samples, scale=scale, likelihood=lik, generator=generator, **kw
            )
    elif method == "last_layer":
        bll, selection["last_layer_noise"] = _evidence_last_layer(net, traj.mean, x, y, lik)
        lik = _gaussian_like(lik, bll.noise_variance)
        model = WeightEnsembleSurrogate(
            net, bll.sample(num_samples, generator=generator), likelihood=lik, **kw
        )
        selection["prior_precision"] = float(bll.prior_precision)
        selection["log_evidence"] = float(bll.log_evidence)
    else:
        devs = traj.deviations()
        pca = PCASubspace(min(rank, devs.shape[0] - 1)).fit(devs, generator=generator)
        sub = SubspaceModel(net, traj.mean, pca.projection, lik, temperature=n / pca.rank)
        thetas = None
        if x_val is not None:
            _, thetas, _ = sub.select_temperature(
                x, y, x_val, y_val, num_samples=num_samples, burn_in=num_samples,
                generator=generator,
            )  # fmt: skip
        if method == "pca_ess":
            if thetas is None:
                thetas = sub.sample_ess(x, y, num_samples, burn_in=num_samples, generator=generator)
                sub.check_fit(x, y, thetas)
        else:
            sub.fit_vi(x, y, num_steps=300, generator=generator)
            thetas = sub.sample_vi(num_samples, generator=generator)
        selection["temperature"] = sub.temperature
        if conditional:
            w, lik = _conditional_last_layers(net, [traj.mean], [sub.weights(thetas)], x, y,
                                              lik, generator, selection)  # fmt: skip
            model = WeightEnsembleSurrogate(net, w, likelihood=lik, **kw)
        else:
            model = WeightEnsembleSurrogate.from_subspace(sub, thetas, **kw)
    if lik.learns_noise or method == "last_layer" or conditional:
        selection["noise_variance"] = lik.target_noise_variance
    model.variance_calibration = None
    if calibrate is None:
        calibrate = x_val is None
    if calibrate:
        options = dict(
            method=method, num_samples=num_samples, hidden_features=hidden_features,
            epochs=epochs, swa_epochs=swa_epochs, lr=lr, weight_decay=weight_decay,
            batch_size=batch_size, rank=rank, num_components=num_components,
            validation_fraction=0.0, likelihood=kind, swag_scale=scale,
            recipes={rname: recipes[rname]}, calibrate=False,
            bayesian_last_layer=bayesian_last_layer, normalize_last_hidden=normalize_last_hidden,
            standardize=standardize,
        )  # fmt: skip
        seed = int(torch.randint(2**62, (1,), generator=generator))
        folds_done = [0]

        def fit_fold(x_fold: torch.Tensor, y_fold: torch.Tensor) -> WeightEnsembleSurrogate:
            folds_done[0] += 1
            fold_gen = torch.Generator().manual_seed(seed + folds_done[0])
            return fit_weight_ensemble(x_fold, y_fold, generator=fold_gen, **options)

        x_all = x if x_val is None else torch.cat([x, x_val])
        y_all = y if y_val is None else torch.cat([y, y_val])
        reverts = bool(prior_reversion) and lik.is_regression
        result = cross_validated_variance_scale(
            fit_fold, x_all, y_all.unsqueeze(-1), num_folds=calibration_folds,
            generator=torch.Generator().manual_seed(seed), prior_reversion=reverts,
        )  # fmt: skip
        model.epistemic_scale = result.scale
        model.variance_calibration = result
        if reverts:
            attach_prior_reversion(model, y_all.unsqueeze(-1) if result.prior_reversion else None)
    selection["epistemic_scale"] = float(model.epistemic_scale)
    selection["prior_reversion"] = model._modules.get("prior_reversion") is not None
    model.fit_selection = selection
    return model
