"""Benchmarks: every speed claim of the course, measured side by side in one run and reported as ratios."""

__all__: list[str] = []
