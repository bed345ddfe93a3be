"""What the deploy tests check every manifest against: the gateway's real CLI parser and settings loader."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import yaml

from gateway.cli.main import build_parser
from gateway.config import settings as gateway_settings
from gateway.config.settings import Settings, settings_from_text
from gateway.fleet_sync import REPLICA_ENV

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"

PENDING_SETTINGS = {("auth",), ("gateway", "admin_port")}
"""Settings the deploy configs use that another branch adds (API keys: `auth`, `gateway.admin_port`):
dropped before loading only while the loader does not know them; once merged they are validated too."""


class ArgumentError(AssertionError):
    pass


def parse_cli(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace:
    """Parse like the program would; an unknown or renamed flag fails with argparse's own message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(args)
    except SystemExit as exc:
        raise ArgumentError(f"{' '.join(args)!r}: {stderr.getvalue().strip()}") from exc


def gateway_command(args: list[str]) -> argparse.Namespace:
    return parse_cli(build_parser(), args)


def sim_command(args: list[str]) -> argparse.Namespace:
    from backends.sim.__main__ import parse_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parse_args(args)
    except SystemExit as exc:
        raise ArgumentError(f"{' '.join(args)!r}: {stderr.getvalue().strip()}") from exc


def _known(path: tuple[str, ...]) -> bool:
    struct: Any = gateway_settings.ConfigFile
    for part in path:
        fields = getattr(struct, "__struct_fields__", ())
        if part not in fields:
            return False
        struct = struct.__annotations__.get(part) if hasattr(struct, "__annotations__") else None
        struct = _struct_of(struct)
    return True


def _struct_of(annotation: Any) -> Any:
    if isinstance(annotation, str):
        return getattr(gateway_settings, annotation, None)
    return annotation


def load_gateway_config(text: str, folder: Path, policy: str | None = None) -> Settings:
    """Validate a deploy config with the real loader (policy file next to it, as when mounted)."""
    data = yaml.safe_load(text)
    for path in PENDING_SETTINGS:
        if not _known(path):
            parent = data
            for part in path[:-1]:
                parent = parent.get(part, {})
            parent.pop(path[-1], None)
    folder.mkdir(parents=True, exist_ok=True)
    if policy is not None:
        (folder / "policy.yaml").write_text(policy)
    return settings_from_text(yaml.safe_dump(data), str(folder / "gateway.yaml"))


def gateway_env_names() -> set[str]:
    """Environment variables the gateway reads (the admin key's name comes from the settings when known)."""
    names = {REPLICA_ENV, "SWITCHYARD_CONFIG", "SWITCHYARD_ADMIN_KEY"}
    auth = getattr(gateway_settings, "AuthOptions", None)
    if auth is not None:
        names.add(auth().admin_key_env)
    return names


_DEFAULTED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*)|:?\?[^}]*)?\}")


def compose_defaults(value: str) -> str:
    """Substitute `${VAR:-default}` by its default (and `${VAR:?message}` by a placeholder), as Compose
    would with an empty environment."""
    return _DEFAULTED.sub(lambda m: m.group(2) if m.group(2) is not None else "set-by-operator", value)
