import sys

from ttlib.cli.main import main

__all__: list[str] = []

sys.exit(main())
