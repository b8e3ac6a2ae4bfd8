"""gpext.subspace."""

__all__: list[str] = []
