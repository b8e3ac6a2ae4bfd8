"""gpext.nn."""

__all__: list[str] = []
