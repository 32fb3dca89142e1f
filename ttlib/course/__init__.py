"""What the course's notebooks lean on: their list, the checks after each exercise, plots and videos, thread
helpers, and `ttlib lab`."""

__all__: list[str] = []
