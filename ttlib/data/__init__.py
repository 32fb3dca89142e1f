"""The offline data: datasets built here or read from Minari, checked before training, and cut into training
windows."""

__all__: list[str] = []
