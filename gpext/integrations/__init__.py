"""Integrations with other libraries; each is imported explicitly by the user."""

__all__: list[str] = []
