"""One-dimensional minimisation on a grid refined by golden-section search.

The post-hoc calibrations of gpext (a noise variance, a likelihood temperature, a variance
scale, all chosen on held-out rows) minimise a cheap, unimodal-near-the-optimum function of one
log-scale parameter.  :func:`minimize_scalar_on_grid` evaluates the grid, then narrows the
bracket ``[g_{k-1}, g_{k+1}]`` around the best grid point ``g_k`` by golden-section search.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gpext.errors import InputDataError, expected_got

__all__ = ["minimize_scalar_on_grid"]

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def minimize_scalar_on_grid(
    fn: Callable[[float], float],
    grid: Sequence[float],
    *,
    iterations: int = 60,
) -> tuple[float, float]:
    r"""Minimise ``fn`` over ``[min(grid), max(grid)]``: best grid point, then golden section.

    With :math:`g_k = \arg\min_i f(g_i)` over the sorted grid, the search narrows
    :math:`[g_{k-1}, g_{k+1}]` (clipped to the grid) by the golden ratio ``iterations`` times
    and returns the midpoint of the final bracket, or :math:`g_k` itself if that is lower.  The
    result never leaves the grid's range and is never worse than the best grid point.
    Non-finite values of ``fn`` count as :math:`+\infty`.

    Args:
        fn: The function to minimise (typically of a log-scale parameter).
        grid: At least one finite point.
        iterations: Golden-section steps (each shrinks the bracket by 0.618).

    Returns:
        ``(x, fn(x))``.

    Raises:
        InputDataError: For an empty grid or a non-finite grid point.

    Example:
        >>> x, f = minimize_scalar_on_grid(lambda t: (t - 0.3) ** 2, [-1.0, 0.0, 1.0])
        >>> round(x, 6)
        0.3
    """
    points = sorted(float(g) for g in grid)
    if not points or not all(math.isfinite(g) for g in points):
        raise InputDataError(
            expected_got("minimize_scalar_on_grid.grid", "one or more finite numbers", grid)
        )

    def f(t: float) -> float:
        value = float(fn(t))
        return value if math.isfinite(value) else math.inf

    values = [f(g) for g in points]
    k = min(range(len(points)), key=values.__getitem__)
    lo, hi = points[max(k - 1, 0)], points[min(k + 1, len(points) - 1)]
    for _ in range(int(iterations)):
        a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
        if f(a) <= f(b):
            hi = b
        else:
            lo = a
    x = 0.5 * (lo + hi)
    fx = f(x)
    if fx > values[k]:
        return points[k], values[k]
    return x, fx
