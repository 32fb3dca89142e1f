"""The `ttlib` command line: one module per group of commands."""
