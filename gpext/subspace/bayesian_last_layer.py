r"""Bayesian linear regression on a network's last hidden layer, hyperparameters by the evidence."""

from __future__ import annotations

import itertools
import math
import warnings

import torch
from torch import nn

from gpext.errors import (
    ConvergenceWarning,
    InputDataError,
    InputTypeError,
    NotFittedError,
    ShapeError,
    VarianceCollapseWarning,
    expected_got,
)
from gpext.subspace.flat_parameters import FlatParameters
from gpext.utils import check_positive_int
from gpext.utils.validation import as_float_tensor, check_finite, check_not_low_precision

__all__ = ["BayesianLastLayer"]


class BayesianLastLayer(nn.Module):
    r"""Exact Gaussian posterior over the last linear layer of a regression network.

    The network's body :math:`h(x) \in \mathbb R^{H}` is kept fixed (e.g. at the SWA mean);
    with :math:`\phi(x) = [h(x), 1]` (the 1 when the layer has a bias, :math:`M` features)
    and the model :math:`y = \phi(x)^\top w + \varepsilon`, :math:`w \sim \mathcal N(0,
    \alpha^{-1} I)`, :math:`\varepsilon \sim \mathcal N(0, \beta^{-1})`, the posterior is

    .. math::

        w \mid \mathcal D \sim \mathcal N(m, S), \qquad
        S^{-1} = \alpha I + \beta \Phi^\top\Phi, \qquad m = \beta S \Phi^\top y,

    and the predictive of a new point is
    :math:`\mathcal N(\phi^\top m,\ \phi^\top S \phi + \beta^{-1})`.  :math:`\alpha` and
    :math:`\beta` maximise the log evidence (type-II maximum likelihood, MacKay 1992)

    .. math::

        \log p(y \mid \alpha, \beta) = \tfrac M2 \log\alpha + \tfrac N2 \log\beta
        - \tfrac\beta2 \lVert y - \Phi m\rVert^2 - \tfrac\alpha2 \lVert m\rVert^2
        - \tfrac12 \log\lvert S^{-1}\rvert - \tfrac N2 \log 2\pi,

    by MacKay's fixed-point updates :math:`\gamma = \sum_i \lambda_i / (\alpha + \lambda_i)`
    (:math:`\lambda_i` the eigenvalues of :math:`\beta\Phi^\top\Phi`),
    :math:`\alpha \leftarrow \gamma / \lVert m\rVert^2`,
    :math:`\beta \leftarrow (N - \gamma) / \lVert y - \Phi m\rVert^2` (the updates of
    scikit-learn's ``BayesianRidge`` without its Gamma hyperpriors).  This is the surrogate
    of DNGO (Snoek et al. 2015) on a gpext network: where the training features do not
    span the directions of :math:`\phi(x)`, the prior variance :math:`\alpha^{-1}` remains,
    so the predictive variance grows where the features differ from the training features.

    Measured on Branin with 12 scrambled-Sobol points (seeds 0-2, the one-hidden-layer
    network of :func:`~gpext.integrations.botorch.fit_weight_ensemble` at its SWA mean, 512
    uniform test points): the correlation between the predictive sd and the distance to the
    nearest training point was 0.45-0.48 (SWAG on the same networks: -0.12 to 0.12;
    ``SingleTaskGP``: 0.80-0.84).  The evidence is maximised on the training rows, so the
    intervals of an interpolating network are too narrow: calibrate them on held-out
    points (``fit_weight_ensemble`` does so by cross-validation on small designs).

    The evidence can prefer explaining the targets as noise: :math:`\alpha \to \infty`,
    :math:`m \to 0` (with 5 points and 51 features, on one of 36 small Branin designs).  The
    updates stop once the effective number of parameters :math:`\gamma` is below
    :math:`10^{-6}`; ``collapsed`` is then set and a
    :class:`~gpext.errors.VarianceCollapseWarning` says so.  Fixing ``noise_precision`` (e.g.
    at the noise the network learned) keeps a signal.

    :meth:`sample_conditional` redraws the last layers of other weight samples (SWAG, PCA
    subspaces) from their exact posteriors given each sample's body, at the fitted
    precisions (the small-design default of
    :func:`~gpext.integrations.botorch.fit_weight_ensemble`).

    Only the last module that holds parameters is Bayesian; it must be a
    :class:`torch.nn.Linear` with one output (a homoscedastic regression network such as
    ``gpext.subspace.regression_network("homoscedastic_gaussian", ...)``).  The body is read
    at :meth:`fit`; change the module's weights afterwards and :meth:`sample` still
    returns the body it was fitted on.

    Args:
        module: The network (its last layer ``nn.Linear(H, 1)``).
        prior_precision: :math:`\alpha` fixed (``None``: by the evidence).
        noise_precision: :math:`\beta` fixed (``None``: by the evidence).
        max_iter: At most this many fixed-point updates.
        tol: Stop when :math:`\alpha` and :math:`\beta` change by less than this relative
            amount.
        max_noise_precision: Upper bound on :math:`\beta` relative to
            :math:`1 / \operatorname{var}(y)` (an interpolating body drives the evidence
            to zero noise).

    The state (buffers, in the state dict with the body's weights): ``posterior_mean``
    (:math:`m`), ``precision_cholesky`` (the Cholesky factor of :math:`S^{-1}`),
    ``base_weights`` (the network's flat weights at :meth:`fit`), ``prior_precision`` and
    ``noise_precision`` (:math:`\alpha`, :math:`\beta`), ``log_evidence`` (at them) and
    ``num_iterations`` (the fixed-point updates made), ``collapsed`` (the evidence's
    preference for pure noise, above).

    Raises:
        InputTypeError: If ``module`` is not a module, or its last layer is not a
            one-output ``nn.Linear``.
        InputDataError: If a fixed precision or a setting is not positive.

    Example:
        >>> import torch
        >>> from gpext.subspace import BayesianLastLayer
        >>> g = torch.Generator().manual_seed(0)
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        >>> x = torch.rand(30, 2, generator=g); y = x.sum(-1) + 0.1 * torch.randn(30, generator=g)
        >>> bll = BayesianLastLayer(net).fit(x, y)
        >>> mean, variance = bll.predict(x[:4])
        >>> bll.sample(5, generator=g).shape == (5, sum(p.numel() for p in net.parameters()))
        True
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        prior_precision: float | None = None,
        noise_precision: float | None = None,
        max_iter: int = 300,
        tol: float = 1e-6,
        max_noise_precision: float = 1e8,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise InputTypeError(
                expected_got("BayesianLastLayer.module", "a torch.nn.Module", type(module).__name__)
            )
        flat_all = FlatParameters(module)
        head = FlatParameters(module, "last_layer")
        layer = _owner(module, head.names[0])
        if not isinstance(layer, nn.Linear) or layer.out_features != 1:
            raise InputTypeError(
                expected_got(
                    "BayesianLastLayer.module",
                    "a network whose last layer is torch.nn.Linear(H, 1)",
                    f"{type(layer).__name__}"
                    + (
                        f" with {layer.out_features} outputs"
                        if isinstance(layer, nn.Linear)
                        else ""
                    ),
                    "Use a homoscedastic regression network (one mean output).",
                )
            )
        for name, value in (("prior_precision", prior_precision),
                            ("noise_precision", noise_precision),
                            ("tol", tol), ("max_noise_precision", max_noise_precision)):  # fmt: skip
            if value is not None and not (
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0
            ):
                raise InputDataError(
                    expected_got(f"BayesianLastLayer.{name}", "a finite number > 0", value)
                )
        # the module is not registered (its weights are not this posterior's state)
        self.__dict__["module"] = module
        self.__dict__["_layer"] = layer
        self._flat = flat_all
        self.fixed_prior_precision = prior_precision
        self.fixed_noise_precision = noise_precision
        self.max_iter = check_positive_int(max_iter, "BayesianLastLayer.max_iter")
        self.tol = float(tol)
        self.max_noise_precision = float(max_noise_precision)
        self.has_bias = layer.bias is not None
        m = layer.in_features + int(self.has_bias)
        d = flat_all.num_parameters
        # positions of the last layer's weight row, then its bias, in the flat weight vector
        # (the order of the features [h(x), 1])
        starts = dict(zip(flat_all.names, itertools.accumulate([0, *flat_all.numels])))
        self._head_index = torch.cat(
            [torch.arange(starts[n], starts[n] + size) for n, size in zip(head.names, head.numels)]
        )
        like = {"dtype": layer.weight.dtype, "device": layer.weight.device}
        #: Posterior mean :math:`m` of the last layer's weights (bias last). # shape: (M,)
        self.register_buffer("posterior_mean", torch.zeros(m, **like))
        #: Cholesky factor of the posterior precision :math:`S^{-1}`. # shape: (M, M)
        self.register_buffer("precision_cholesky", torch.eye(m, **like))
        #: The network's flat weights at :meth:`fit`, the body of every draw. # shape: (D,)
        self.register_buffer("base_weights", torch.zeros(d, **like))
        self.register_buffer("prior_precision", torch.tensor(1.0))
        self.register_buffer("noise_precision", torch.tensor(1.0))
        self.register_buffer("log_evidence", torch.tensor(float("nan")))
        self.register_buffer("num_iterations", torch.tensor(0))
        self.register_buffer("fitted", torch.tensor(False))
        self.register_buffer("collapsed", torch.tensor(False))

    # ------------------------------------------------------------------ features and fitting
    def features(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        r""":math:`\phi(x) = [h(x), 1]`, the inputs of the last layer (and the bias column).

        Args:
            x: Network inputs. # shape: (N, ...)
            weights: Flat weights of the whole network to evaluate at (``None``: its current
                weights; the module's parameters are not changed either way). # shape: (D,)

        Returns:
            The features. # shape: (N, M)
        """
        seen: list[torch.Tensor] = []
        hook = self._layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
        try:
            with torch.no_grad():
                if weights is None:
                    self.module(x)
                else:
                    self._flat.functional_call(weights, x)
        finally:
            hook.remove()
        if len(seen) != 1:
            raise InputDataError(
                expected_got("BayesianLastLayer.features", "one call of the last layer per forward",
                             f"{len(seen)} calls")
            )  # fmt: skip
        h = seen[0].reshape(x.shape[0], -1)
        return torch.cat([h, h.new_ones(h.shape[0], 1)], -1) if self.has_bias else h

    def fit(self, x: torch.Tensor, y: torch.Tensor) -> BayesianLastLayer:
        """Posterior and evidence-tuned precisions from training data (the body as it is now).

        Args:
            x: Training inputs. # shape: (N, ...)
            y: Targets. # shape: (N,) or (N, 1)

        Returns:
            ``self``.

        Raises:
            ShapeError: If ``x`` and ``y`` disagree in rows or ``y`` has several columns.
            InputDataError: On non-finite data or features, or fewer than two rows.

        Warns:
            ConvergenceWarning: If the fixed-point updates did not settle in ``max_iter``.
            VarianceCollapseWarning: If the evidence explains the targets as noise
                (``collapsed``).
        """
        like = next(self.module.parameters())
        x, y = _training_data(x, y, "BayesianLastLayer.fit", like)
        if y.shape[0] < 2:
            raise InputDataError(
                expected_got("BayesianLastLayer.fit", "at least 2 rows", y.shape[0])
            )
        phi = self.features(x)
        check_finite(phi, "BayesianLastLayer.features(x) (the network's hidden layer)")
        # float64 throughout (the precisions span many orders of magnitude)
        f64, y64 = phi.double(), y.double()
        n, m = f64.shape
        gram, fty = f64.mT @ f64, f64.mT @ y64
        eig = torch.linalg.eigvalsh(gram).clamp(min=0)
        var_y = float(y64.var()) if float(y64.var()) > 0 else 1.0
        alpha = self.fixed_prior_precision or 1.0
        beta = self.fixed_noise_precision or 1.0 / var_y
        beta_max = self.max_noise_precision / var_y
        converged = (
            self.fixed_prior_precision is not None and self.fixed_noise_precision is not None
        )
        iters, collapsed = 0, False
        while not converged and iters < self.max_iter:
            iters += 1
            mean, _ = _posterior(gram, fty, alpha, beta)
            lam = beta * eig
            gamma = float((lam / (alpha + lam)).sum())
            if gamma < _COLLAPSED_GAMMA and self.fixed_prior_precision is None:
                collapsed = True  # alpha -> infinity: the limit is the pure-noise model
                if self.fixed_noise_precision is None:  # its noise: the targets' mean square
                    beta = min(n / max(float(y64 @ y64), 1e-300), beta_max)
                break
            resid = float(((y64 - f64 @ mean) ** 2).sum())
            new_alpha = alpha
            if self.fixed_prior_precision is None:
                new_alpha = gamma / max(float(mean @ mean), 1e-300)
            new_beta = beta
            if self.fixed_noise_precision is None:
                new_beta = min(max(n - gamma, 1e-12) / max(resid, 1e-300), beta_max)
            change = max(abs(math.log(new_alpha / alpha)), abs(math.log(new_beta / beta)))
            alpha, beta = new_alpha, new_beta
            converged = change < self.tol
        if collapsed:
            warnings.warn(
                f"BayesianLastLayer.fit: the evidence explains the {n} targets as noise (prior "
                f"precision {alpha:.3g} growing without bound, effective parameters {gamma:.2g} "
                f"of {m}): the posterior mean is about 0 and its variance about {1 / alpha:.2g}. "
                "The last layer's features do not explain the targets at this sample size; fix "
                "noise_precision (e.g. at the noise the network learned) to keep a signal.",
                VarianceCollapseWarning,
                stacklevel=2,
            )
        elif not converged:
            warnings.warn(
                f"BayesianLastLayer.fit: the evidence updates did not settle in {self.max_iter} "
                f"iterations (alpha {alpha:.3g}, beta {beta:.3g}); raise max_iter or fix "
                "prior_precision / noise_precision.",
                ConvergenceWarning,
                stacklevel=2,
            )
        mean, chol = _posterior(gram, fty, alpha, beta)
        resid = float(((y64 - f64 @ mean) ** 2).sum())
        log_ev = (
            0.5 * m * math.log(alpha) + 0.5 * n * math.log(beta) - 0.5 * beta * resid
            - 0.5 * alpha * float(mean @ mean) - float(torch.log(torch.diagonal(chol)).sum())
            - 0.5 * n * math.log(2 * math.pi)
        )  # fmt: skip
        dtype, device = like.dtype, like.device
        self.posterior_mean = mean.to(dtype=dtype, device=device)
        self.precision_cholesky = chol.to(dtype=dtype, device=device)
        self.base_weights = self._flat.flatten().to(dtype=dtype, device=device)
        self.prior_precision = torch.tensor(alpha, dtype=torch.float64, device=device)
        self.noise_precision = torch.tensor(beta, dtype=torch.float64, device=device)
        self.log_evidence = torch.tensor(log_ev, dtype=torch.float64, device=device)
        self.num_iterations = torch.tensor(iters, device=device)
        self.fitted = torch.tensor(True, device=device)
        self.collapsed = torch.tensor(collapsed, device=device)
        return self

    # ------------------------------------------------------------------ posterior use
    @property
    def noise_variance(self) -> float:
        r""":math:`\beta^{-1}`."""
        self._check_fitted("noise_variance")
        return 1.0 / float(self.noise_precision)

    def covariance(self) -> torch.Tensor:
        """Posterior covariance :math:`S` of the last layer's weights. # shape: (M, M)"""
        self._check_fitted("covariance")
        return torch.cholesky_inverse(self.precision_cholesky.double()).to(self.posterior_mean)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Predictive mean :math:`\phi^\top m` and epistemic variance :math:`\phi^\top S\phi`
        (add :attr:`noise_variance` for a new observation).

        Args:
            x: Inputs. # shape: (N, ...)

        Returns:
            ``(mean, variance)``, each of shape ``(N,)``.
        """
        self._check_fitted("predict")
        like = self.posterior_mean
        x = _as_input(x, "BayesianLastLayer.predict(x)", like)
        check_finite(x, "BayesianLastLayer.predict(x)")
        phi = self.features(x, self.base_weights).to(like)  # the body fitted on
        chol = self.precision_cholesky.double()
        solved = torch.linalg.solve_triangular(chol, phi.double().mT, upper=False)
        return phi @ self.posterior_mean, solved.pow(2).sum(0).to(like)

    def sample(self, num_samples: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
        r"""Flat weight vectors of the whole network: the body fitted on, the last layer
        drawn from :math:`\mathcal N(m, S)`.

        Args:
            num_samples: ``S``.
            generator: Random generator.

        Returns:
            Weights in :class:`~gpext.subspace.FlatParameters` order. # shape: (S, D)
        """
        self._check_fitted("sample")
        s = check_positive_int(num_samples, "BayesianLastLayer.sample(num_samples)")
        chol = self.precision_cholesky.double()
        eps = torch.randn(chol.shape[0], s, generator=generator, dtype=torch.float64)
        # w = m + L^{-T} eps has covariance (L L^T)^{-1} = S
        draws = torch.linalg.solve_triangular(chol.mT, eps.to(chol.device), upper=True).mT
        head = self.posterior_mean + draws.to(self.posterior_mean)
        out = self.base_weights.expand(s, -1).clone()
        out[:, self._head_index.to(out.device)] = head
        return out

    def sample_conditional(
        self,
        weights: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        r"""Each row's last layer redrawn from its exact posterior given that row's body.

        For flat weight vectors :math:`w_1, \dots, w_S` (e.g. SWAG or subspace samples of the
        whole network) with bodies :math:`b_s`, features :math:`\Phi_s = \phi(X; b_s)`, and
        this posterior's fitted precisions :math:`\alpha, \beta`:

        .. math::

            S_s^{-1} = \alpha I + \beta \Phi_s^\top\Phi_s, \qquad
            m_s = \beta S_s \Phi_s^\top y, \qquad
            w_s^{\text{last}} \sim \mathcal N(m_s, S_s),

        the bodies kept.  The result samples :math:`q(b)\,p(w^{\text{last}} \mid b, \mathcal
        D)`: the weight posterior's spread of the body, and the last layer's prior variance
        :math:`\alpha^{-1}` in the directions that body's training features do not span,
        which SGD-trajectory posteriors (SWAG, PCA subspaces) do not explore.

        Args:
            weights: Flat weights of the whole network, in
                :class:`~gpext.subspace.FlatParameters` order. # shape: (S, D)
            x: The training inputs the precisions were fitted on. # shape: (N, ...)
            y: Their targets. # shape: (N,) or (N, 1)
            generator: Random generator.

        Returns:
            The weights with every last layer redrawn. # shape: (S, D)

        Raises:
            NotFittedError: Before :meth:`fit`.
            ShapeError: If ``weights`` is not ``(S, D)`` or ``x`` and ``y`` disagree in rows.
            InputDataError: On non-finite weights, data or features.
        """
        self._check_fitted("sample_conditional")
        like = self.posterior_mean
        d = self.base_weights.shape[0]
        if not isinstance(weights, torch.Tensor) or weights.dim() != 2 or weights.shape[-1] != d:
            raise ShapeError(
                expected_got("BayesianLastLayer.sample_conditional(weights)", f"shape (S, {d})",
                             getattr(weights, "shape", type(weights).__name__))
            )  # fmt: skip
        weights = weights.to(like)
        check_finite(weights, "BayesianLastLayer.sample_conditional(weights)")
        x, y = _training_data(x, y, "BayesianLastLayer.sample_conditional", like)
        alpha, beta = float(self.prior_precision), float(self.noise_precision)
        index = self._head_index.to(weights.device)
        y64 = y.double()
        out = weights.clone()
        for s in range(weights.shape[0]):
            phi = self.features(x, weights[s]).double()
            check_finite(phi, "BayesianLastLayer.sample_conditional: the features of a row")
            mean, chol = _posterior(phi.mT @ phi, phi.mT @ y64, alpha, beta)
            eps = torch.randn(chol.shape[0], 1, generator=generator, dtype=torch.float64)
            draw = torch.linalg.solve_triangular(chol.mT, eps.to(chol.device), upper=True)
            out[s, index] = (mean + draw.squeeze(-1)).to(out)
        return out

    def _check_fitted(self, what: str) -> None:
        if not bool(self.fitted):
            raise NotFittedError(f"BayesianLastLayer.{what}: call fit(x, y) first.")


_COLLAPSED_GAMMA = 1e-6  # effective parameters below which the evidence chose pure noise


def _as_input(x: object, name: str, like: torch.Tensor) -> torch.Tensor:
    x = check_not_low_precision(as_float_tensor(x, name), name)
    return x.to(dtype=like.dtype, device=like.device)


def _training_data(x, y, name: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` as tensors like ``like``, ``y`` of shape ``(N,)``, checked and finite."""
    x = _as_input(x, f"{name}(x)", like)
    y = _as_input(y, f"{name}(y)", like)
    if y.dim() == 2 and y.shape[-1] == 1:
        y = y.squeeze(-1)
    if y.dim() != 1 or x.dim() < 1 or x.shape[0] != y.shape[0]:
        raise ShapeError(
            expected_got(f"{name}(x, y)", "x (N, ...) and y (N,) or (N, 1)",
                         f"{tuple(x.shape)} and {tuple(y.shape)}")
        )  # fmt: skip
    check_finite(x, f"{name}(x)")
    check_finite(y, f"{name}(y)")
    return x, y


def _posterior(gram, fty, alpha, beta):
    """``(m, L)`` with ``L L^T = alpha I + beta Phi^T Phi`` and ``m = beta S Phi^T y``."""
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    chol = torch.linalg.cholesky(alpha * eye + beta * gram)
    mean = beta * torch.cholesky_solve(fty[:, None], chol).squeeze(-1)
    return mean, chol


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    """The submodule holding parameter ``param_name``."""
    prefix = param_name.rpartition(".")[0]
    return module.get_submodule(prefix) if prefix else module
