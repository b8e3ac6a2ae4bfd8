"""gpext.mlls."""

__all__: list[str] = []
