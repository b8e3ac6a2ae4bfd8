"""A random subspace of weight space (the baseline of Izmailov, Maddox et al. 2019)."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, NotFittedError, expected_got
from gpext.subspace.pca_subspace import _check_deviations
from gpext.utils import check_positive_int

__all__ = ["RandomSubspace"]


class RandomSubspace(nn.Module):
    r"""Projection onto ``r`` random orthonormal directions, scaled by the trajectory's spread.

    With a Gaussian matrix :math:`G \in \mathbb{R}^{r \times D}` orthonormalised by a QR
    factorisation, :math:`G^\top = Q R`, the rows :math:`q_j` of :math:`Q^\top` are uniformly
    distributed orthonormal directions. Given the ``K`` deviations :math:`d_k` of a weight
    trajectory from its mean (rows of :math:`\hat D`), each direction is scaled by the
    trajectory's standard deviation along it,

    .. math::

        P = \operatorname{diag}(s)\, Q^\top, \qquad
        s_j^2 = \frac{1}{K - 1} \sum_{k=1}^{K} (q_j^\top d_k)^2, \qquad
        w = \hat w + P^\top \theta,

    so that, as for :class:`~gpext.subspace.PCASubspace`, a standard normal :math:`\theta`
    reproduces the trajectory's spread along the chosen directions. Without deviations
    (``fit(None, num_parameters=D)``) the rows have norm ``scale``. The random subspace is the
    control for the PCA and curve subspaces: the same inference in directions that ignore
    the trajectory (Izmailov et al. 2019 found it clearly worse than PCA on the UCI sets).

    Args:
        rank: Subspace dimension ``r``.
        scale: Row norm when no deviations are given.

    Example:
        >>> sub = RandomSubspace(rank=3).fit(torch.randn(10, 50), generator=torch.Generator().manual_seed(0))
        >>> sub.projection.shape
        torch.Size([3, 50])
    """

    def __init__(self, rank: int = 20, scale: float = 1.0) -> None:
        super().__init__()
        self.rank = check_positive_int(rank, "RandomSubspace.rank")
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise InputDataError(expected_got("RandomSubspace.scale", "a positive number", scale))
        self.scale = float(scale)
        self.register_buffer("_projection", torch.empty(0, 0))

    @property
    def projection(self) -> torch.Tensor:
        """The projection matrix ``P``. # shape: (r, D)"""
        if self._projection.numel() == 0:
            raise NotFittedError("RandomSubspace: call fit(deviations) first.")
        return self._projection

    def fit(
        self,
        deviations: torch.Tensor | None,
        *,
        num_parameters: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> RandomSubspace:
        """Draw the directions and scale them by the spread of ``deviations``.

        Args:
            deviations: The ``K >= 2`` collected deviations as rows, or ``None`` (then
                ``num_parameters`` gives ``D`` and every row has norm ``scale``).
                # shape: (K, D)
            num_parameters: ``D`` when ``deviations`` is ``None``.
            dtype: Dtype when ``deviations`` is ``None`` (default: torch's default).
            device: Device when ``deviations`` is ``None``.
            generator: Random generator of the directions (on the CPU).

        Returns:
            ``self``.

        Raises:
            ShapeError: If ``deviations`` is not a matrix.
            InputDataError: On fewer than two deviations, ``rank > D``, non-finite deviations
                or neither deviations nor ``num_parameters``.
        """
        if deviations is None:
            if num_parameters is None:
                raise InputDataError(
                    expected_got(
                        "RandomSubspace.fit", "deviations or num_parameters", None,
                        "Pass the trajectory's deviations, or num_parameters=D.",
                    )
                )  # fmt: skip
            d = check_positive_int(num_parameters, "RandomSubspace.fit(num_parameters)")
            dtype = dtype or torch.get_default_dtype()
        else:
            deviations = _check_deviations(deviations, "RandomSubspace.fit(deviations)")
            d = deviations.shape[1]
            dtype, device = deviations.dtype, deviations.device
        if self.rank > d:
            raise InputDataError(
                expected_got(
                    "RandomSubspace.rank", f"at most the number of weights ({d})", self.rank
                )
            )
        g = torch.randn(d, self.rank, generator=generator, dtype=torch.float64)
        q, _ = torch.linalg.qr(g)  # shape: (D, r), orthonormal columns
        q = q.T.to(dtype=dtype, device=device)  # shape: (r, D)
        if deviations is None:
            scale = torch.full((self.rank, 1), self.scale, dtype=dtype, device=device)
        else:
            proj = deviations @ q.T  # shape: (K, r)
            scale = (proj.pow(2).sum(0) / (deviations.shape[0] - 1)).sqrt().unsqueeze(-1)
            if bool((scale == 0).all()):
                raise InputDataError(
                    expected_got(
                        "RandomSubspace.fit(deviations)", "deviations with a spread", "all zero"
                    )
                )
        self._projection = scale * q
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: D401
        key = prefix + "_projection"
        if key in state_dict:
            self._projection = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
