import sys

from ttlib.cli.main import main

sys.exit(main())
