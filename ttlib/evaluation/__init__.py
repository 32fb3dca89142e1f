"""Evaluation: agents played in real environments, one at a time or vectorized, in one process or over Ray actors."""

__all__: list[str] = []
