"""The `ttlib` command line: one module per group of commands."""

__all__: list[str] = []
