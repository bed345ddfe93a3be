"""`python -m gateway.cli`: the `switchyard` command without its installed script."""

import sys

from gateway.cli.main import main

sys.exit(main())
