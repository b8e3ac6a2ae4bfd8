"""MultiSWAG: a mixture of independently trained weight posteriors (SWAG or factor analysis)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.subspace.bayesian_model_averaging import predict_weight_samples
from gpext.subspace.data import _check_reiterable, _is_loader
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.swag import SWAG
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.subspace.weight_posterior import WeightMixture, WeightPosterior

__all__ = ["MultiSWAG"]


class MultiSWAG(WeightMixture):
    r"""Mixture :math:`\frac1M \sum_{m=1}^M \mathcal{N}(\bar w_m, \Sigma_m)` of weight posteriors.

    Each component comes from a separate training run (Wilson & Izmailov 2020): usually a
    :class:`~gpext.subspace.SWAG`, but any :class:`~gpext.subspace.WeightPosterior` mixes,
    e.g. :class:`~gpext.subspace.OnlineFactorAnalysis` posteriors (004 argues for mixing
    factor-analysis posteriors).  A :class:`~gpext.subspace.WeightMixture` with equal weights:
    :meth:`sample` draws ``S`` weight vectors **in total**, ``S / M`` from every component
    when ``M`` divides ``S`` (component by component), so a Bayesian model average over them
    weights the components equally; ``mean`` is the mixture mean (a tensor, as for SWAG);
    :meth:`covariance` a low-rank-plus-diagonal LinearOperator.

    Parameter selection: the components may cover a selection of the networks' parameters
    (``parameters``, :class:`~gpext.subspace.FlatParameters`: ``"all"``, ``"requires_grad"``,
    ``"last_layer"``, names or a predicate), e.g. SWAG posteriors of
    :class:`~gpext.subspace.TrajectoryCollector` s built with ``parameters="last_layer"``;
    every component then holds the :math:`D` selected weights only.  With ``modules`` (one
    network shared by all components, or one per component, its training run's) the mixture
    knows which network each component belongs to, and :meth:`predict` evaluates every
    component's draws with its own network, the parameters outside the selection fixed at
    that network's values (for independently trained networks a last-layer draw is only
    meaningful on the body it was trained on).  :meth:`from_trajectories` builds this from the
    runs' collectors.

    Args:
        components: The weight posteriors (same number of weights).
        modules: The network all components belong to, or one network per component
            (``None``: a mixture over weight vectors only; :meth:`predict` is then
            unavailable).
        parameters: Which parameters of ``modules`` the components cover (needs
            ``modules`` unless ``"all"``).

    Raises:
        InputTypeError: If a component is not a weight posterior, or a module not a
            :class:`torch.nn.Module`.
        InputDataError: If the list is empty or the weight dimensions differ; for a selection
            without ``modules``, a number of modules that is neither 1 nor ``M``, or modules
            whose selections name different parameters.
        ShapeError: If the selection of a module does not have the components' number of
            weights.

    Example:
        >>> multi = MultiSWAG([swag_a, swag_b])  # doctest: +SKIP
        >>> multi.sample(10).shape               # doctest: +SKIP
        torch.Size([10, D])
        >>> last = MultiSWAG.from_trajectories([traj_a, traj_b])  # last-layer collectors  # doctest: +SKIP
        >>> w = last.sample(10)                                    # doctest: +SKIP
        >>> last.predict(w, x_test, likelihood)["means"].shape     # doctest: +SKIP
        torch.Size([10, N])
    """

    def __init__(
        self,
        components: Sequence[WeightPosterior],
        *,
        modules: nn.Module | Sequence[nn.Module] | None = None,
        parameters: ParameterSelection = "all",
    ) -> None:
        super().__init__(components)
        self._flats: list[FlatParameters] | None = None
        if modules is None:
            if not (isinstance(parameters, str) and parameters == "all"):
                raise InputDataError(
                    expected_got("MultiSWAG.parameters", "'all' without modules",
                                 repr(parameters),
                                 "Pass modules= (the network, or one per component) so the "
                                 "selection can be resolved, or use from_trajectories.")
                )  # fmt: skip
            return
        nets = [modules] if isinstance(modules, nn.Module) else list(modules)
        for net in nets:
            if not isinstance(net, nn.Module):
                raise InputTypeError(
                    expected_got("MultiSWAG.modules", "a torch.nn.Module or a sequence of them",
                                 type(net).__name__)
                )  # fmt: skip
        m = self.num_components
        if len(nets) not in (1, m):
            raise InputDataError(
                expected_got("MultiSWAG.modules", f"one network, or one per component ({m})",
                             f"{len(nets)} networks")
            )  # fmt: skip
        flats = [FlatParameters(net, parameters) for net in nets]
        d = self.num_parameters
        for i, flat in enumerate(flats):
            if flat.num_parameters != d:
                raise ShapeError(
                    expected_got(f"MultiSWAG.modules[{i}]",
                                 f"a selection of {d} weights, the components' number",
                                 f"{flat.num_parameters} weights in {flat.names}",
                                 "Select the parameters the components were collected on.")
                )  # fmt: skip
            if flat.names != flats[0].names:
                raise InputDataError(
                    expected_got(f"MultiSWAG.modules[{i}]",
                                 f"the parameters {flats[0].names} of modules[0]", flat.names)
                )  # fmt: skip
        self._flats = flats * m if len(flats) == 1 else flats

    @classmethod
    def from_trajectories(
        cls,
        trajectories: Sequence[TrajectoryCollector],
        *,
        diagonal: bool = True,
        scale: float = 0.5,
    ) -> MultiSWAG:
        """One :class:`~gpext.subspace.SWAG` per training run, each with its run's network.

        The collectors' networks become ``modules`` and their (common) selection
        ``parameters``, so :meth:`predict` evaluates every component on its own network.

        Args:
            trajectories: One :class:`~gpext.subspace.TrajectoryCollector` per run, all over
                the same parameter names.
            diagonal: As in :meth:`SWAG.from_trajectory <gpext.subspace.SWAG.from_trajectory>`.
            scale: Default covariance scale of every component.

        Returns:
            The MultiSWAG.

        Raises:
            InputTypeError: For an entry that is not a collector.
            InputDataError: For no collectors, or collectors over different parameters.
            NotFittedError: If a collector is empty.
        """
        trajectories = list(trajectories)
        for t in trajectories:
            if not isinstance(t, TrajectoryCollector):
                raise InputTypeError(
                    expected_got("MultiSWAG.from_trajectories", "TrajectoryCollector instances",
                                 type(t).__name__)
                )  # fmt: skip
        if not trajectories:
            raise InputDataError(
                expected_got("MultiSWAG.from_trajectories", "at least one collector", 0)
            )
        names = trajectories[0].flat.names
        for i, t in enumerate(trajectories):
            if t.flat.names != names:
                raise InputDataError(
                    expected_got(f"MultiSWAG.from_trajectories[{i}]",
                                 f"a collector of the parameters {names}", t.flat.names,
                                 "Collect every run with the same parameters= selection.")
                )  # fmt: skip
        components = [SWAG.from_trajectory(t, diagonal=diagonal, scale=scale) for t in trajectories]
        return cls(components, modules=[t.flat.module for t in trajectories], parameters=names)

    @property
    def parameter_names(self) -> list[str] | None:
        """Names of the parameters the components cover (``None`` without ``modules``)."""
        return None if self._flats is None else list(self._flats[0].names)

    @property
    def modules_per_component(self) -> list[nn.Module] | None:
        """The network of every component (``None`` without ``modules``)."""
        return None if self._flats is None else [f.module for f in self._flats]

    def sample(
        self,
        num_samples: int,
        *,
        scale: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``num_samples`` draws in all, split equally over the components.

        Args:
            num_samples: Total draws ``S``.
            scale: Covariance scale of every component (default: each component's own).
            generator: Random generator.

        Returns:
            Samples, component by component. # shape: (S, D)
        """
        kwargs = {} if scale is None else {"scale": scale}
        return super().sample(num_samples, generator=generator, **kwargs)

    def predict(
        self,
        weights: torch.Tensor,
        x: torch.Tensor | Iterable,
        likelihood: OutputLikelihood,
        *,
        bn_inputs: torch.Tensor | Iterable | None = None,
        buffers: Mapping[str, torch.Tensor] | None = None,
        batch_size: int = 4096,
    ) -> dict[str, torch.Tensor]:
        """Predict with draws of :meth:`sample`, each on its component's network.

        The ``S`` rows of ``weights`` are split over the components as :meth:`sample` makes
        them (:meth:`~gpext.subspace.WeightMixture.allocation`, component by component), and
        each block is evaluated by :func:`~gpext.subspace.predict_weight_samples` on its
        component's network with the selected parameters replaced (the others the network's).

        A loader of inputs is read once per component (the networks differ), so with several
        components it must be re-iterable and yield the same batches in the same order on
        every pass (``shuffle=False``); a pass whose batches differ (shapes or sums) from the
        first is an error rather than predictions of misaligned rows.

        Args:
            weights: Draws, component by component (what :meth:`sample` returns).
                # shape: (S, D)
            x: Test inputs, or a loader of input batches. # shape: (N, ...)
            likelihood: How to read the outputs.
            bn_inputs: Inputs (or a loader) for refreshing batch-norm statistics per draw.
            buffers: Buffers used for every draw instead of each network's own.
            batch_size: Test points per forward pass (tensor inputs).

        Returns:
            As :func:`~gpext.subspace.predict_weight_samples`: regression
            ``{"means": (S, N), "variances": (S, N)}``, classification ``{"probs": (S, N, C)}``.

        Raises:
            InputDataError: For a MultiSWAG built without ``modules``, or a loader whose passes
                differ.
            ShapeError: For weights that are not ``(S, D)``.
            InputTypeError: For a one-shot iterator as ``x`` with several components.
        """
        if self._flats is None:
            raise InputDataError(
                expected_got("MultiSWAG.predict", "a MultiSWAG built with modules=",
                             "one without networks",
                             "Build it with modules= or MultiSWAG.from_trajectories, or call "
                             "predict_weight_samples(module, weights, x, likelihood).")
            )  # fmt: skip
        d = self.num_parameters
        if not isinstance(weights, torch.Tensor) or weights.dim() != 2 or weights.shape[-1] != d:
            raise ShapeError(
                expected_got("MultiSWAG.predict(weights)", f"shape (S, {d})",
                             tuple(getattr(weights, "shape", ())) or type(weights).__name__)
            )  # fmt: skip
        counts = self.allocation(weights.shape[0])
        passes = None
        if _is_loader(x) and sum(n > 0 for n in counts) > 1:
            _check_reiterable(x, "MultiSWAG.predict(x)")
            x = passes = _PassRecorder(x)
        outs = []
        for flat, block in zip(self._flats, torch.split(weights, counts)):
            if block.shape[0] == 0:
                continue
            pred = predict_weight_samples(flat.module, block, x, likelihood, bn_inputs=bn_inputs,
                                          buffers=buffers, batch_size=batch_size,
                                          parameters=flat.names)  # fmt: skip
            outs.append(pred)
        if passes is not None and any(p != passes.passes[0] for p in passes.passes[1:]):
            raise InputDataError(
                expected_got("MultiSWAG.predict(x)", "a loader that yields the same batches on "
                             "every pass (one pass per component)",
                             "passes with different batches (a shuffling loader?)",
                             "Use shuffle=False for the test loader.")
            )  # fmt: skip
        return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


class _PassRecorder:
    """A re-iterable view of a loader that records each pass's batches as (shape, sum) pairs."""

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self.passes: list[list[tuple[tuple[int, ...], float]]] = []

    def __iter__(self):
        prints: list[tuple[tuple[int, ...], float]] = []
        self.passes.append(prints)
        for batch in self.loader:
            first = batch[0] if isinstance(batch, (tuple, list)) and len(batch) > 0 else batch
            if isinstance(first, torch.Tensor) and not first.is_complex():
                prints.append((tuple(first.shape), float(first.detach().double().sum())))
            yield batch
