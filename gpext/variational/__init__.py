"""gpext.variational."""

__all__: list[str] = []
