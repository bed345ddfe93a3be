"""The policies shipped with Switchyard, usable by name (`policy: balanced`) or as a file to copy."""

from __future__ import annotations

from pathlib import Path

PRESETS_DIR = Path(__file__).parent / "presets"
DEFAULT_PRESET = "balanced"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve(name_or_path: str, relative_to: Path | None = None) -> Path:
    """A preset's file for a bare name; otherwise the path (relative to the config file's folder)."""
    if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        return PRESETS_DIR / f"{name_or_path}.yaml"
    path = Path(name_or_path)
    if not path.is_absolute() and relative_to is not None:
        path = relative_to / path
    return path
