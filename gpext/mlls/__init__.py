"""gpext.mlls: training objectives (GWI's expected log-likelihood plus Wasserstein-2 distance)."""

from gpext.mlls.gwi_objective import GWIObjective

__all__: list[str] = ["GWIObjective"]
