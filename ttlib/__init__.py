"""ttlib: the Trajectory Transformer from scratch, made fast. One module per idea; see the course notebooks."""

__all__: list[str] = []

__version__ = "0.1.0"
