"""Variational bootstrap for MLPs, trained as one vectorised ensemble (001 Sec. 4.1, Alg. 1)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch

from gpext.bootstrap._targets import (
    check_classes,
    check_inputs,
    check_task,
    dirichlet_targets,
    particle_average_probs,
    particle_mixture,
    regression_targets,
)
from gpext.bootstrap.ensemble_mlp import EnsembleMLP
from gpext.bootstrap.rbf_hyperparameters import fit_rbf_hyperparameters
from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.fit import (
    FitResult,
    Standardizer,
    check_explained_variance,
    check_heldout,
    check_predictions_vary,
    holdout_split,
    reference_heldout_nll,
    train_loop,
)
from gpext.fit.diagnostics import NETWORK_FIT_ADVICE
from gpext.likelihoods.dirichlet_transform import DirichletTransform
from gpext.utils import check_layer_widths, check_learning_rate, check_positive_int

__all__ = ["DEFAULT_EPOCHS", "MIN_DEFAULT_STEPS", "VBootMLP"]

#: Particles of the copy that :meth:`VBootMLP.fit` trains for its held-out check.
CHECK_PARTICLES = 3
#: :meth:`VBootMLP.fit`'s default number of epochs on large data (001's MNIST protocol).
DEFAULT_EPOCHS = 12
#: Fewest optimiser steps of :meth:`VBootMLP.fit`'s default on small data.
MIN_DEFAULT_STEPS = 500


def _adam_kernel(p: torch.Tensor) -> dict:
    """Adam's single-kernel (fused) update where torch has it for this device and dtype."""
    if p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float64):
        return {"fused": True}
    return {"foreach": True}


def _particle_generator(seed: int, index: int) -> torch.Generator:
    """The generator of particle ``index``: independent of which other particles are trained."""
    return torch.Generator().manual_seed((seed * 1_000_003 + index * 7_919 + 12_345) % 2**63)


class VBootMLP(torch.nn.Module):
    r"""Variational-bootstrap ensemble of NTK-parameterised ReLU MLPs.

    Particle ``k`` minimises the perturbed, anchored objective of 001 Eq. (7),

    .. math::
        \sum_{i=1}^N \sum_{c=1}^C \frac{(\tilde y_{ic}^{(k)} - f_c(\mathbf{x}_i,
        \boldsymbol\theta^{(k)}))^2}{2 \sigma_{ic}^2} + \frac{1}{2\alpha^2}
        \|\boldsymbol\theta^{(k)} - \tilde{\boldsymbol\theta}^{(k)}\|^2,
        \quad \tilde y_{ic}^{(k)} \sim \mathcal{N}(y_{ic}, \sigma_{ic}^2),\
        \tilde{\boldsymbol\theta}^{(k)} \sim \mathcal{N}(0, \alpha^2 \mathbf{I}),

    with labels perturbed by their own noise (001 Eq. 5, 13), an anchor drawn from the prior
    (Eq. 6) that is also the particle's initial value (Algorithm 1, line 9), and minibatch Adam.
    The network is the NTK-parameterised MLP of Eq. (2); all particles are stacked in one
    :class:`EnsembleMLP` and trained together: one batched forward and backward pass and one
    fused Adam update per step, whatever ``K``.  This removes the per-step fixed cost (Python,
    autograd, optimizer) ``K - 1`` times, which pays off when that cost dominates (small
    networks or batches, accelerators).  It does not reduce the matmul FLOPs: for the 2 x 512
    network at batch 256 on one CPU core the step is FLOP-bound, and training ``K = 10``
    particles one after another was measured as fast or faster (``benchmarks/vboot.py``), since
    one particle's weights and Adam state stay in cache while the stacked ones do not.

    Every random quantity of particle ``k`` (anchor, initial weights, perturbed labels) comes
    from a generator seeded by ``(seed, k)`` and the minibatch order from ``seed`` alone, so a
    subset of particles can be trained on its own (``fit(..., particle_indices=...)``, e.g. one
    subset per machine) and the fitted subsets combined with :meth:`merge`; the result equals
    training all particles together up to floating-point rounding.

    Targets are centred by their precision-weighted mean per output (added back at
    prediction), so that the zero-mean prior of the output bias need not absorb the offset of
    the Dirichlet targets.  Regression uses a Gaussian likelihood with noise ``noise`` (fitted
    once by :func:`~gpext.bootstrap.fit_rbf_hyperparameters` on a subset when ``None``);
    classification uses the Dirichlet transform (001 Eq. 10-11) and predicts the particle
    average of the softmax (001 Eq. 12).

    Args:
        num_particles: Total number of particles ``K`` of the ensemble.
        hidden_sizes: Hidden widths (001: ``(512, 512)``; one integer: one hidden layer).
        task: ``"regression"`` or ``"classification"``.
        num_classes: Number of classes ``C`` (required for classification).
        prior_std: Prior standard deviation ``alpha`` of every weight and bias.
        noise: Regression noise variance (scalar, ``(N,)`` or ``(N, C)``); fitted when ``None``.
        alpha_epsilon: Dirichlet ``alpha_epsilon`` (classification), passed to
            :class:`gpext.likelihoods.dirichlet_transform.DirichletTransform`.
        seed: Seed of all random draws (see above).
        dtype: Parameter dtype; default the dtype of the training inputs.
        standardize: The data contract of :class:`gpext.fit.Standardizer`: inputs (and
            regression targets) standardised on the training data inside the model,
            predictions in the original units, a given ``noise`` read in the original units.
            ``False``: the data are used as given.

    Example:
        >>> x = torch.randn(64, 3)
        >>> y = (x[:, 0] > 0).long()
        >>> model = VBootMLP(4, hidden_sizes=(16,), task="classification", num_classes=2)
        >>> result = model.fit(x, y, epochs=2, batch_size=32)
        >>> model.predict_proba(x[:5]).shape
        torch.Size([5, 2])
    """

    def __init__(
        self,
        num_particles: int = 10,
        hidden_sizes: Sequence[int] = (512, 512),
        *,
        task: str = "regression",
        num_classes: int | None = None,
        prior_std: float = 1.0,
        noise: float | torch.Tensor | None = None,
        alpha_epsilon: float = 0.01,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        standardize: bool = True,
    ) -> None:
        super().__init__()
        self.standardizer = Standardizer(
            inputs=standardize, targets=standardize and task == "regression", name="VBootMLP"
        )
        self.num_particles = check_positive_int(num_particles, "VBootMLP.num_particles")
        self.hidden_sizes = check_layer_widths(hidden_sizes, "VBootMLP.hidden_sizes")
        self.task = check_task(task, "VBootMLP")
        self.num_classes = check_classes(task, num_classes, "VBootMLP")
        if not prior_std > 0:
            raise InputDataError(expected_got("VBootMLP.prior_std", "a positive number", prior_std))
        if task == "classification" and noise is not None:
            raise InputDataError(
                "VBootMLP: noise is set by the Dirichlet transform for classification; pass "
                "alpha_epsilon instead of noise."
            )
        if task == "classification":
            DirichletTransform(self.num_classes, alpha_epsilon)  # validates alpha_epsilon early
        self.prior_std = float(prior_std)
        self.noise = noise
        self.alpha_epsilon = float(alpha_epsilon)
        self.seed = int(seed)
        self.dtype = dtype
        self.net: EnsembleMLP | None = None

    # ------------------------------------------------------------------ state
    def _build(self, indices: Sequence[int], d: int, c: int, dtype, device) -> None:
        self.net = EnsembleMLP(len(indices), d, c, self.hidden_sizes, dtype=dtype, device=device)
        self.register_buffer(
            "particle_indices", torch.as_tensor(list(indices), dtype=torch.long, device=device)
        )
        self.register_buffer("offset", torch.zeros(c, dtype=dtype, device=device))
        # the regression noise in the original units (one per output for several outputs)
        shape = (c,) if c > 1 else ()
        self.register_buffer("noise_", torch.full(shape, float("nan"), dtype=dtype, device=device))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict, building the (lazily created) network from its shapes first."""
        if self.net is None and "particle_indices" in state_dict:
            w0 = state_dict["net.weights.0"]
            c = state_dict["offset"].shape[0]
            self._build(
                state_dict["particle_indices"].tolist(), w0.shape[1], c, w0.dtype, w0.device
            )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or a state-dict load) has run."""
        return self.net is not None

    def _check_fitted(self, what: str) -> None:
        if self.net is None:
            raise NotFittedError(f"VBootMLP.{what}: the model is not fitted; call fit(x, y) first.")

    def draw_anchors(self, index: int, d: int, c: int) -> list[torch.Tensor]:
        """Particle ``index``'s prior draw ``theta~`` (001 Eq. 6), in float64 on the CPU.

        Args:
            index: Global particle index.
            d: Input dimension.
            c: Output dimension.

        Returns:
            Tensors in the order of :meth:`EnsembleMLP.parameter_shapes`.
        """
        gen = _particle_generator(self.seed, index)
        sizes = [d, *self.hidden_sizes, c]
        shapes = [(a, b) for a, b in zip(sizes[:-1], sizes[1:])] + [(1, b) for b in sizes[1:]]
        return [torch.randn(s, generator=gen, dtype=torch.float64) * self.prior_std for s in shapes]

    # ------------------------------------------------------------------ fitting
    def _targets(self, x, y):
        n = x.shape[0]
        if self.task == "classification":
            self.standardizer.fit(x)
            targets, noise = dirichlet_targets(
                y, self.num_classes, self.alpha_epsilon, n, "VBootMLP.fit", x.dtype, x.device
            )
            return targets, noise, None
        targets, noise = regression_targets(y, self.noise, n, "VBootMLP.fit", x.dtype, x.device)
        st = self.standardizer
        st.fit(x, targets)
        targets = st.transform_targets(targets)
        s2 = (st.y_scale.to(targets) if st.targets else torch.ones(1).to(targets)).pow(2)
        scalar = None
        if noise is None:
            hp = fit_rbf_hyperparameters(
                st.transform_inputs(x), targets, None, num_points=500,
                generator=torch.Generator().manual_seed(self.seed),
            )  # fmt: skip
            scalar = float(hp.noise)
            noise = torch.full_like(targets, scalar)
        else:
            noise = noise / s2
            if torch.as_tensor(self.noise).numel() == 1:
                scalar = float(torch.as_tensor(self.noise)) / float(s2.mean())
        # the scalar noise in the original units, per output
        return targets, noise, None if scalar is None else scalar * s2

    def fit(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        particle_indices: Sequence[int] | None = None,
        epochs: int | None = None,
        num_epochs: int | None = None,
        batch_size: int = 256,
        lr: float = 0.1,
        cosine_decay: bool = True,
        show_progress: bool | None = None,
        check: bool = True,
    ) -> FitResult:
        """Train the particles (all, or the subset ``particle_indices``) together.

        The learning rate is large by the usual standard of Adam (``1e-3``) on purpose.  Adam
        moves every parameter by about ``lr`` per step whatever the gradient's scale, and under
        the NTK parameterisation (001 Eq. 2) the weights are of order ``prior_std`` and enter
        divided by :math:`\\sqrt{D_{l-1}}`: a step changes a unit's input by about
        :math:`\\mathrm{lr} \\sqrt{D_{l-1}}`, against :math:`\\mathrm{lr}\\, D_{l-1}` under the
        standard parameterisation with weights of order :math:`1 / \\sqrt{D_{l-1}}`.  The
        equivalent of a standard ``lr = 5e-3`` for a 512-wide layer is therefore about ``0.1``.
        Measured on letter (26 classes, 15000 points, batch 512, one 2 x 512 particle, cosine
        decay over 6 epochs): 33 % test error at ``lr = 3e-3``, 14 % at ``3e-2``, 8 % at ``0.1``.

        Args:
            x: Training inputs.  # shape: (N, d)
            y: Regression targets ``(N,)``/``(N, C)`` or class labels ``(N,)``.
            particle_indices: Global indices in ``[0, num_particles)`` of the particles to
                train; default all.  Fit disjoint subsets on different workers and combine
                them with :meth:`merge`.
            epochs: Passes over the data (the name every gpext fit uses; default: 12, or as
                many as give at least
                :data:`MIN_DEFAULT_STEPS` optimiser steps when the data are small: 12
                epochs of 10 points are 12 full-batch steps, after which the particles
                still sat near their anchors, :math:`R^2 < 0` on the training targets).
            num_epochs: The older name of ``epochs`` (give one of them).
            batch_size: Minibatch size (the likelihood term is rescaled by ``N / B``).
            lr: Adam learning rate (see above; ``0.1`` suits 512-wide NTK layers on
                standardised inputs).
            cosine_decay: Anneal the learning rate to zero over the run (cosine schedule).
            show_progress: Progress bar over epochs.
            check: Run the end-of-fit checks: the training-set checks, and for one regression
                output the shared held-out check (:func:`gpext.fit.check_heldout`): a copy
                with at most :data:`CHECK_PARTICLES` particles, the fitted noise and the same
                budget is trained on 80% of the rows and scored on the rest (about
                ``CHECK_PARTICLES / K`` of the fit's cost again); skipped with fewer than 50
                rows and for ``particle_indices`` fits (check the merged model instead).

        Returns:
            The :class:`~gpext.fit.FitResult` of :func:`gpext.fit.train_loop` (``losses``: the
            mean minibatch data term per epoch, summed over particles).

        Raises:
            FitError: On a non-finite loss or parameter (the last finite state is restored).
            InputDataError: On bad indices, labels or values.
            ShapeError: If ``x`` and ``y`` disagree.
        """
        x = check_inputs(x, "VBootMLP.fit", self.dtype)
        n, d = x.shape
        batch_size = min(check_positive_int(batch_size, "VBootMLP.fit batch_size"), n)
        if epochs is not None and num_epochs is not None:
            raise InputDataError(
                expected_got("VBootMLP.fit", "epochs or its older name num_epochs, not both",
                             f"epochs={epochs!r}, num_epochs={num_epochs!r}")
            )  # fmt: skip
        num_epochs = epochs if epochs is not None else num_epochs
        if num_epochs is None:  # full minibatches only: n // batch_size steps per epoch
            num_epochs = max(DEFAULT_EPOCHS, math.ceil(MIN_DEFAULT_STEPS / (n // batch_size)))
        num_epochs = check_positive_int(num_epochs, "VBootMLP.fit num_epochs")
        lr = check_learning_rate(lr, "VBootMLP.fit lr")
        indices = (
            list(range(self.num_particles))
            if particle_indices is None
            else [int(i) for i in particle_indices]
        )
        if (
            not indices
            or len(set(indices)) != len(indices)
            or min(indices) < 0
            or max(indices) >= self.num_particles
        ):
            raise InputDataError(
                expected_got(
                    "VBootMLP.fit particle_indices",
                    f"distinct integers in [0, {self.num_particles})",
                    particle_indices,
                )
            )
        targets, noise, scalar_noise = self._targets(x, y)
        c = targets.shape[1]
        prec = noise.reciprocal()
        offset = (prec * targets).sum(0) / prec.sum(0)
        self._build(indices, d, c, x.dtype, x.device)
        self.offset.copy_(offset)
        if scalar_noise is not None:
            self.noise_.copy_(scalar_noise.reshape(self.noise_.shape))
        x_original, x = x, self.standardizer.transform_inputs(x)
        anchors = [self.draw_anchors(i, d, c) for i in indices]
        anchors = [torch.stack(ts).to(x) for ts in zip(*anchors)]  # each (K, ...)
        with torch.no_grad():
            for p, a in zip(self.net.stacked_parameters(), anchors):
                p.copy_(a)  # Algorithm 1, line 9: start at the anchor
        eps = torch.stack(
            [
                torch.randn(
                    n, c, generator=_particle_generator(self.seed, i + 2**31), dtype=torch.float64
                )
                for i in indices
            ]
        ).to(x)
        y_pert = (targets - offset) + eps * noise.sqrt()  # shape: (K, N, C)
        del eps
        result = self._train(
            x, y_pert, prec, anchors, num_epochs, batch_size, lr, cosine_decay, show_progress
        )
        # degenerate-fit check on (up to 2048) training points: the particle mean must vary
        # and, for regression, explain some of the targets' variance
        with torch.no_grad():
            sub = slice(0, min(n, 2048))
            mean = self(x_original[sub]).mean(0)  # shape: (M, C)
            if self.task == "regression":
                mean = self.standardizer.transform_targets(mean)
        check_predictions_vary(mean, targets[sub], name="VBootMLP", result=result, stacklevel=3)
        if self.task == "regression":
            check_explained_variance(mean, targets[sub], name="VBootMLP", result=result,
                                     stacklevel=3, advice=NETWORK_FIT_ADVICE)  # fmt: skip
        if check and self.task == "regression" and c == 1 and particle_indices is None:
            self._check_heldout(x_original, y, num_epochs, batch_size, lr, cosine_decay, result)
        self.fit_result_ = result
        return result

    def _check_heldout(self, x, y, num_epochs, batch_size, lr, cosine_decay, result) -> None:
        y = torch.as_tensor(y).reshape(x.shape[0], -1)[:, 0].to(x)
        split = holdout_split(x.shape[0], 0.2, torch.Generator().manual_seed(self.seed + 7919))
        if split is None or x.shape[0] < 50 or not bool(torch.isfinite(self.noise_).all()):
            return
        tr, te = (i.to(x.device) for i in split)
        copy = VBootMLP(
            min(self.num_particles, CHECK_PARTICLES), self.hidden_sizes, prior_std=self.prior_std,
            noise=float(self.noise_.reshape(-1)[0]), seed=self.seed, dtype=self.dtype,
            standardize=self.standardizer.inputs,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the copy's own diagnostics are not the model's
            copy.fit(x[tr], y[tr], epochs=num_epochs, batch_size=batch_size, lr=lr,
                     cosine_decay=cosine_decay, show_progress=False, check=False)  # fmt: skip
        means, variances = copy.predict_mixture(x[te])
        reference = reference_heldout_nll(x[tr], y[tr], x[te], y[te],
                                          generator=torch.Generator().manual_seed(0))  # fmt: skip
        check_heldout(
            means.mean(0), variances.mean(0) + means.var(0, unbiased=False), y[te],
            train_mean=y[tr].double().mean(), name="VBootMLP", result=result,
            what="rows held out from a refit on the rest", stacklevel=3,
            reference_nll=reference,
        )  # fmt: skip

    def _train(
        self,
        x: torch.Tensor,
        y_pert: torch.Tensor,
        prec: torch.Tensor,
        anchors: list[torch.Tensor],
        num_epochs: int,
        batch_size: int,
        lr: float,
        cosine_decay: bool,
        show_progress: bool | None,
    ) -> FitResult:
        r"""Minibatch Adam on the stacked objective; one batched step serves all particles.

        Per step: one forward and one backward pass through the stacked network (batched
        matmuls), the prior gradient :math:`(\theta - \tilde\theta) / (\alpha^2 N)` added in
        place to the stacked gradients (no autograd graph over the ~K x 280k parameters), and one
        fused Adam update of the stacked tensors.  Nothing loops over particles.
        """
        n = x.shape[0]
        params = self.net.stacked_parameters()
        opt = torch.optim.Adam(params, lr=lr, **_adam_kernel(params[0]))
        data_gen = torch.Generator().manual_seed(self.seed)

        def batches(_epoch):  # full minibatches only: each step sees B points
            perm = torch.randperm(n, generator=data_gen).to(x.device)
            return [perm[s : s + batch_size] for s in range(0, n - batch_size + 1, batch_size)]

        result = train_loop(
            lambda idx: self._step_gradients(x[idx], y_pert[:, idx], prec[idx], anchors, n),
            opt, modules=[self.net], epochs=num_epochs, batches=batches,
            lr_schedule="cosine" if cosine_decay else "constant",
            show_progress=show_progress, desc="vboot mlp",
        )  # fmt: skip
        self.net.eval()
        return result

    def _step_gradients(
        self,
        x: torch.Tensor,
        y_pert: torch.Tensor,
        prec: torch.Tensor,
        anchors: list[torch.Tensor],
        num_data: int,
    ) -> torch.Tensor:
        r"""Set the stacked gradients to those of the minibatch estimate of 001 Eq. (7) / N.

        For particle ``k`` and a batch :math:`\mathcal B` of size ``B``,

        .. math::
            \frac{1}{2B} \sum_{i \in \mathcal B} \sum_c \frac{(\tilde y^{(k)}_{ic}
            - f_c(\mathbf x_i, \boldsymbol\theta^{(k)}))^2}{\sigma_{ic}^2}
            + \frac{1}{2 \alpha^2 N} \|\boldsymbol\theta^{(k)} - \tilde{\boldsymbol\theta}^{(k)}\|^2,

        an unbiased estimate of Eq. (7) divided by ``N``.  The data term is differentiated by
        one batched backward pass (the particles' terms are summed, which leaves each particle's
        gradient its own); the prior gradient :math:`(\boldsymbol\theta - \tilde{\boldsymbol
        \theta}) / (\alpha^2 N)` is added in place.  Gradients must be cleared beforehand.

        Args:
            x: Batch inputs.  # shape: (B, d)
            y_pert: Perturbed, centred targets of the batch.  # shape: (K, B, C)
            prec: Noise precisions of the batch.  # shape: (B, C)
            anchors: Stacked anchors, order of :meth:`EnsembleMLP.stacked_parameters`.
            num_data: ``N``.

        Returns:
            The data term of the minibatch (detached; the gradients are already set).
        """
        f = self.net._forward(x)  # shape: (K, B, C); x checked by fit
        loss = (y_pert - f).square().mul(prec).sum().div(2.0 * x.shape[0])
        loss.backward()
        coef = 1.0 / (self.prior_std**2 * num_data)
        with torch.no_grad():
            for p, a in zip(self.net.stacked_parameters(), anchors):
                p.grad.add_(p - a, alpha=coef)
        return loss.detach()

    @classmethod
    def merge(cls, models: Sequence[VBootMLP]) -> VBootMLP:
        """Combine separately fitted particle subsets into one ensemble.

        Args:
            models: Fitted :class:`VBootMLP` objects with the same configuration and disjoint
                ``particle_indices`` (e.g. one per worker).

        Returns:
            A new model holding all their particles, sorted by global index.

        Raises:
            NotFittedError: If a model is not fitted.
            InputDataError: If the configurations differ or particle indices overlap.
        """
        models = list(models)
        if not models:
            raise InputDataError(
                expected_got("VBootMLP.merge models", "at least one fitted model", "none")
            )
        for m in models:
            m._check_fitted("merge")
        ref = models[0]
        keys = ("num_particles", "hidden_sizes", "task", "prior_std", "alpha_epsilon", "seed")
        for m in models[1:]:
            for key in keys:
                if getattr(m, key) != getattr(ref, key):
                    raise InputDataError(
                        expected_got(
                            f"VBootMLP.merge {key}",
                            repr(getattr(ref, key)),
                            repr(getattr(m, key)),
                            "Merge only subsets of one ensemble.",
                        )
                    )
            if m.net.layer_sizes != ref.net.layer_sizes or not torch.allclose(m.offset, ref.offset):
                raise InputDataError(
                    "VBootMLP.merge: the models were fitted on different data (layer sizes or target offsets differ)."
                )
        all_idx = torch.cat([m.particle_indices.cpu() for m in models])
        if all_idx.unique().numel() != all_idx.numel():
            raise InputDataError(
                expected_got(
                    "VBootMLP.merge particle_indices", "disjoint subsets", all_idx.tolist()
                )
            )
        order = all_idx.argsort()
        out = cls(
            ref.num_particles, ref.hidden_sizes, task=ref.task, num_classes=ref.num_classes,
            prior_std=ref.prior_std, noise=ref.noise, alpha_epsilon=ref.alpha_epsilon, seed=ref.seed,
            dtype=ref.dtype,
        )  # fmt: skip
        p0 = ref.net.weights[0]
        out._build(
            all_idx[order].tolist(), ref.net.in_features, ref.net.out_features, p0.dtype, p0.device
        )
        out.offset.copy_(ref.offset)
        out.noise_.copy_(ref.noise_)
        out.standardizer.load_state_dict(ref.standardizer.state_dict())
        with torch.no_grad():
            for j, params in enumerate(zip(*(m.net.stacked_parameters() for m in models))):
                out.net.stacked_parameters()[j].copy_(
                    torch.cat([p.to(p0.device) for p in params])[order.to(p0.device)]
                )
        out.net.eval()
        return out

    # ------------------------------------------------------------------ prediction
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Latent outputs of every particle (target offset added back; in the original units).

        Args:
            x: Inputs.  # shape: (M, d)

        Returns:
            Particle outputs.  # shape: (K, M, C)
        """
        self._check_fitted("forward")
        p0 = self.net.weights[0]
        x = check_inputs(x, "VBootMLP.forward", like=p0)
        if x.shape[-1] != self.net.in_features:
            raise ShapeError(
                expected_got("VBootMLP.forward x", f"{self.net.in_features} columns", x.shape[-1])
            )
        x = self.standardizer.transform_inputs(x)
        f = torch.cat([self.net._forward(xb) for xb in x.split(2048)], dim=1) + self.offset
        return self.standardizer.untransform_targets(f) if self.task == "regression" else f

    @torch.no_grad()
    def predict_mixture(
        self, x: torch.Tensor, noise: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Regression predictive as an equal-weight Gaussian mixture over particles.

        Args:
            x: Test inputs.  # shape: (M, d)
            noise: Test noise variance; default the fitted (or given scalar) noise.

        Returns:
            Component means and variances, ``(K, M)`` for one output or ``(K, M, C)``.

        Raises:
            InputDataError: For a classifier, or when the noise is unknown.
        """
        return particle_mixture("VBootMLP", self.task, self(x), self.noise_, noise)

    @torch.no_grad()
    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities, the particle average of the softmax (001 Eq. 12).

        Args:
            x: Test inputs.  # shape: (M, d)

        Returns:
            Probabilities.  # shape: (M, C)

        Raises:
            InputDataError: For a regression model.
        """
        return particle_average_probs("VBootMLP", self.task, self(x))
