"""gpext.kernels."""

__all__: list[str] = []
