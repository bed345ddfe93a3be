"""`python -m loadtest.bench.http_clients`: see the package docstring."""

import sys

from loadtest.bench.http_clients.run import main

sys.exit(main())
