"""Running SWA moments and a ring buffer of the last K weight deviations."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, NotFittedError, expected_got
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.utils import check_finite, check_positive_int

__all__ = ["TrajectoryCollector"]


class TrajectoryCollector(nn.Module):
    r"""Collect an SGD trajectory: SWA mean, diagonal variance and the last ``K`` deviations.

    After the :math:`n`-th collected weight vector :math:`w_n` (000 Sec. III-A, Algorithm 2;
    SWAG, Maddox et al. 2019), with Welford's update of the sum of squared deviations
    :math:`M_n` (Welford 1962):

    .. math::

        \bar w_n = \bar w_{n-1} + \frac{w_n - \bar w_{n-1}}{n}, \qquad
        M_n = M_{n-1} + (w_n - \bar w_{n-1}) \odot (w_n - \bar w_n), \qquad
        d_n = w_n - \bar w_n,

    so that the diagonal variance is :math:`\sigma^2_n = M_n / n = \overline{w^2}_n - \bar
    w_n^2` (:attr:`variance`), and :math:`d_n` enters a ring buffer of the last
    ``max_deviations`` deviations. Welford's form never subtracts two large second moments: the
    textbook :math:`\overline{w^2} - \bar w^2` in float32 loses the whole variance when
    :math:`|w|` is large against its spread (:math:`|w| \approx 5`, per-collection standard
    deviation 1e-3: relative error 100%), Welford's keeps it to about :math:`\epsilon |w| /
    \sigma` (below 1e-3 there). :attr:`sq_mean`, the running second moment, is still available,
    derived from the two. Memory is
    :math:`O(K D)`. :meth:`step` collects every ``collect_every`` calls (call it once per
    optimiser step or once per epoch). Every collected deviation is returned, so incremental
    subspaces (:class:`~gpext.subspace.InKPCASubspace`) and online factor analysis can be
    updated at the same moment.

    Parameter selection: with ``parameters`` only the selected weights are collected
    (:class:`~gpext.subspace.FlatParameters`; e.g. ``"last_layer"``): :math:`D` is their
    number, and the moments and deviations, hence every posterior built from the collector,
    cover them alone.

    Args:
        module: The network whose parameters are collected (read through
            :class:`~gpext.subspace.FlatParameters`).
        max_deviations: Buffer size ``K``.
        collect_every: Collection period ``c`` in calls to :meth:`step`.
        dtype: Dtype of the stored moments and deviations (default: that of the parameters;
            ``torch.float64`` doubles their memory and makes the moments exact to float64
            rounding).
        parameters: Which parameters are collected (:data:`~gpext.subspace.ParameterSelection`:
            ``"all"``, ``"requires_grad"``, ``"last_layer"``, names or a predicate).

    Example:
        >>> net = torch.nn.Linear(3, 1)
        >>> traj = TrajectoryCollector(net, max_deviations=5)
        >>> for _ in range(3):
        ...     _ = traj.collect()
        >>> traj.num_deviations
        3
    """

    def __init__(
        self,
        module: nn.Module,
        max_deviations: int = 20,
        collect_every: int = 1,
        dtype: torch.dtype | None = None,
        parameters: ParameterSelection = "all",
    ) -> None:
        super().__init__()
        self.flat = FlatParameters(module, parameters)
        self.max_deviations = check_positive_int(
            max_deviations, "TrajectoryCollector.max_deviations"
        )
        self.collect_every = check_positive_int(collect_every, "TrajectoryCollector.collect_every")
        ref = self.flat.flatten()
        kw = {"dtype": dtype or ref.dtype, "device": ref.device}
        d = self.flat.num_parameters
        self.register_buffer("mean", torch.zeros(d, **kw))
        #: Welford's sum of squared deviations :math:`M_n`. # shape: (D,)
        self.register_buffer("m2", torch.zeros(d, **kw))
        self.register_buffer("_deviations", torch.zeros(self.max_deviations, d, **kw))
        self.register_buffer("num_collected_", torch.zeros((), dtype=torch.long))
        self.register_buffer("num_steps_", torch.zeros((), dtype=torch.long))

    @property
    def num_parameters(self) -> int:
        """Number of (selected) weights ``D``."""
        return self.flat.num_parameters

    @property
    def num_collected(self) -> int:
        """Number of weight vectors averaged so far."""
        return int(self.num_collected_)

    @property
    def num_deviations(self) -> int:
        """Number of deviations held in the buffer, ``min(num_collected, K)``."""
        return min(self.num_collected, self.max_deviations)

    def step(self, module: nn.Module | None = None) -> torch.Tensor | None:
        """Count one step; collect on every ``collect_every``-th call.

        Returns:
            The new deviation when a collection happened, else ``None``.
        """
        self.num_steps_ += 1
        if int(self.num_steps_) % self.collect_every == 0:
            return self.collect(module)
        return None

    def collect(self, weights: torch.Tensor | nn.Module | None = None) -> torch.Tensor:
        """Add one weight vector (default: the wrapped module's current parameters).

        Args:
            weights: Flat weights of shape ``(D,)``, another module of the same architecture,
                or ``None``.

        Returns:
            The deviation :math:`d_n = w_n - \\bar w_n`. # shape: (D,)

        Raises:
            ShapeError: If a flat vector has the wrong length.
            InputDataError: If the weights are not finite (the state is left unchanged).
        """
        if weights is None or isinstance(weights, nn.Module):
            w = self.flat.flatten(weights)
        else:
            w = self.flat.check_vector(weights, "TrajectoryCollector.collect(weights)").detach()
        w = check_finite(w, "TrajectoryCollector.collect(weights)").to(self.mean)
        n = self.num_collected + 1
        delta = w - self.mean  # w_n - mean_{n-1}
        self.mean += delta / n
        dev = w - self.mean  # w_n - mean_n
        self.m2.addcmul_(delta, dev)
        self._deviations[(n - 1) % self.max_deviations] = dev
        self.num_collected_ += 1
        return dev.clone()

    @property
    def variance(self) -> torch.Tensor:
        r"""Diagonal SWA variance :math:`\sigma^2 = M_n / n = \overline{w^2} - \bar w^2`. # shape: (D,)

        Computed from Welford's :math:`M_n` (no cancellation); never negative.
        """
        self._check_collected(1)
        return (self.m2 / self.num_collected).clamp_min(0.0)

    @property
    def sq_mean(self) -> torch.Tensor:
        r"""Running second moment :math:`\overline{w^2} = \sigma^2 + \bar w^2`. # shape: (D,)

        Kept for compatibility (it used to be stored). It is derived from :attr:`variance` and
        :attr:`mean`; in float32, :math:`\overline{w^2} - \bar w^2` recomputed from it loses
        the variance again when :math:`|w|` is large against its spread, so use
        :attr:`variance`.  Zero before the first collection.
        """
        if self.num_collected == 0:
            return torch.zeros_like(self.mean)
        return self.variance + self.mean**2

    def deviations(self) -> torch.Tensor:
        """The buffered deviations, oldest first. # shape: (num_deviations, D)

        Raises:
            NotFittedError: If nothing was collected.
        """
        self._check_collected(1)
        n, k = self.num_collected, self.max_deviations
        if n <= k:
            return self._deviations[:n].clone()
        start = n % k
        return torch.cat([self._deviations[start:], self._deviations[:start]])

    def swa_weights(self) -> torch.Tensor:
        """The SWA mean. # shape: (D,)"""
        self._check_collected(1)
        return self.mean.clone()

    def _check_collected(self, minimum: int) -> None:
        if self.num_collected < minimum:
            raise NotFittedError(
                expected_got(
                    "TrajectoryCollector",
                    f"at least {minimum} collected weight vector(s)",
                    self.num_collected,
                    "Call collect() or step() during training first.",
                )
            )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: D401
        # Checkpoints from before Welford's moments hold ``sq_mean`` instead of ``m2``:
        # M_n = n (sq_mean - mean^2), formed in float64 (what they stored cannot be recovered
        # beyond their own rounding).
        old, new = prefix + "sq_mean", prefix + "m2"
        if old in state_dict and new not in state_dict:
            sq_mean = state_dict.pop(old).double()
            mean = state_dict.get(prefix + "mean", self.mean).double()
            n = float(state_dict.get(prefix + "num_collected_", self.num_collected_))
            state_dict[new] = (n * (sq_mean - mean**2)).clamp_min(0.0).to(self.m2.dtype)
        key = prefix + "_deviations"
        if key in state_dict and state_dict[key].shape != self._deviations.shape:
            raise InputDataError(
                expected_got(
                    "TrajectoryCollector.load_state_dict",
                    f"deviation buffer of shape {tuple(self._deviations.shape)}",
                    tuple(state_dict[key].shape),
                )
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
