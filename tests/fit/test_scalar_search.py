"""minimize_scalar_on_grid against scipy's bounded scalar minimiser."""

import math

import pytest
from scipy.optimize import minimize_scalar

from gpext.errors import InputDataError
from gpext.fit import minimize_scalar_on_grid


@pytest.mark.parametrize("shift", [-3.3, 0.0, 0.71, 4.2])
def test_matches_scipy_on_a_smooth_unimodal_function(shift):
    def f(t):
        return math.exp(t - shift) - (t - shift) + 0.1 * (t - shift) ** 2

    grid = [i * 0.5 for i in range(-12, 13)]
    x, fx = minimize_scalar_on_grid(f, grid)
    ref = minimize_scalar(f, bounds=(-6, 6), method="bounded", options={"xatol": 1e-12})
    assert x == pytest.approx(ref.x, abs=1e-7) and fx == pytest.approx(ref.fun, abs=1e-12)


def test_stays_in_range_and_never_worse_than_the_grid():
    x, fx = minimize_scalar_on_grid(lambda t: -t, [0.0, 1.0, 2.0])  # optimum beyond the grid
    assert x <= 2.0 and fx <= -2.0 + 1e-9
    # a spike between grid points: the refinement may not return something worse
    x, fx = minimize_scalar_on_grid(
        lambda t: 0.0 if t == 1.0 else (t - 1.0) ** 2 + 1.0, [0.0, 1.0, 2.0]
    )
    assert x == 1.0 and fx == 0.0
    # non-finite values count as +inf
    x, _ = minimize_scalar_on_grid(
        lambda t: math.nan if t < 0 else (t - 0.5) ** 2, [-1.0, 0.0, 1.0]
    )
    assert x == pytest.approx(0.5, abs=1e-6)


def test_errors():
    with pytest.raises(InputDataError, match="grid"):
        minimize_scalar_on_grid(lambda t: t, [])
    with pytest.raises(InputDataError, match="grid"):
        minimize_scalar_on_grid(lambda t: t, [0.0, math.inf])
