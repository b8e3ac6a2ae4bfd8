"""gpext.bootstrap."""

__all__: list[str] = []
