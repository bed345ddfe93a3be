"""The slow-client test: 500 hostile connections for a minute (about 90 s in all).

Only `make test-hostile` runs this directory (it sets SWITCHYARD_HOSTILE=1); `make test` does not collect it.
"""

from __future__ import annotations

import os

if os.environ.get("SWITCHYARD_HOSTILE") != "1":
    collect_ignore_glob = ["test_*.py"]
