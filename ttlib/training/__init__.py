"""Training: the loop, checkpoints (tensors and JSON, never a pickle), the best model, and data-parallel training
on one machine or a Ray cluster."""

__all__: list[str] = []
