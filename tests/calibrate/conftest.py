"""The proof that a calibrated profile predicts its real vLLM server (issue 35), apart from `make test-vllm`:
it times a real server against the simulator within 20 %, which holds only on a machine nothing else
loads (a GPU runner, or a quiet CPU one). `make test-calibrate` runs it; CI does not (docs/calibrate.md).
"""

from __future__ import annotations

import os

if os.environ.get("SWITCHYARD_CALIBRATE") != "1":
    collect_ignore_glob = ["test_*.py"]
