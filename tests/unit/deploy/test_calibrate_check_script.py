"""deploy/calibrate/check.sh refuses bad options with status 2 before it starts anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "calibrate" / "check.sh"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--repeats", "x"], "--repeats wants a whole number"),
        (["--repeats", "-1"], "--repeats wants a whole number"),
        (["--repeats", ""], "--repeats wants a whole number"),
        (["--no-such-option"], "unknown option --no-such-option"),
    ],
)
def test_a_bad_option_is_named_and_nothing_starts(args: list[str], says: str) -> None:
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert says in result.stderr
    assert "==" not in result.stdout  # no step began
