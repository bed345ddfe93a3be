"""`switchyard keys ...` and `switchyard teams ...`: the admin API (`/admin/v1/keys`, `/admin/v1/teams`)
from a shell, authenticated with the admin key from $SWITCHYARD_ADMIN_KEY or `--admin-key`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

ADMIN_KEY_ENV = "SWITCHYARD_ADMIN_KEY"
_LIMITS = ("rpm", "tpm", "max_parallel", "budget_usd")
_QUOTAS = ("max_file_bytes", "max_stored_files", "max_stored_bytes", "max_open_batches")
_CLEARABLE = (
    "rpm",
    "tpm",
    "max_parallel",
    "budget_usd",
    "expires_at",
    "models",
    "classes",
    "metadata",
    *_QUOTAS,
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8080",
        help="the gateway's admin base URL (its `gateway.admin_port` when set; default: %(default)s)",
    )
    parser.add_argument(
        "--admin-key", default=None, help=f"the admin key (default: ${ADMIN_KEY_ENV}); never printed"
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")


def _limit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rpm", type=int, default=None, help="requests per rate-limit window")
    parser.add_argument(
        "--tpm", type=int, default=None, help="tokens per window (prompt + max_tokens reserved)"
    )
    parser.add_argument("--max-parallel", type=int, default=None, help="requests in flight at once")
    parser.add_argument("--budget-usd", type=float, default=None, help="budget in USD per period")
    parser.add_argument(
        "--budget-period",
        default=None,
        choices=["day", "week", "month", "total"],
        help="the budget's period (UTC; default for a new key or team: month)",
    )


def _key_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=None, help="a human name for the key")
    parser.add_argument("--team", default=None, help="the team the key belongs to (default: default)")
    parser.add_argument(
        "--models", default=None, help="comma-separated models the key may use (default: all)"
    )
    parser.add_argument(
        "--max-priority",
        default=None,
        choices=["high", "normal", "low"],
        help="the highest x-switchyard-priority honoured",
    )
    parser.add_argument(
        "--classes", default=None, help="comma-separated classes the key may ask for (default: any)"
    )
    parser.add_argument(
        "--expires-in", type=float, default=None, help="seconds from now after which the key is refused"
    )
    parser.add_argument(
        "--metadata",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="metadata to attach (repeatable)",
    )
    parser.add_argument("--admin", action="store_true", help="give the key the admin scope")
    _limit_options(parser)
    parser.add_argument(
        "--max-file-bytes", type=int, default=None, help="largest upload (default: batches.max_file_bytes)"
    )
    parser.add_argument(
        "--max-stored-files",
        type=int,
        default=None,
        help="files held at once (default: batches.max_stored_files)",
    )
    parser.add_argument(
        "--max-stored-bytes",
        type=int,
        default=None,
        help="bytes of files held at once (default: batches.max_stored_bytes)",
    )
    parser.add_argument(
        "--max-open-batches",
        type=int,
        default=None,
        help="batches open at once (default: batches.max_open_batches)",
    )


def add_commands(commands: Any) -> None:
    keys = commands.add_parser("keys", help="create, list, show, update, rotate and revoke API keys")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = actions.add_parser("create", help="create a key (its material is printed once)")
    _key_options(create)
    listing = actions.add_parser("list", help="list keys")
    listing.add_argument("--team", default=None, help="only this team's keys")
    show = actions.add_parser("show", help="one key, with its spend this period")
    update = actions.add_parser("update", help="change a key's fields (others stay)")
    _key_options(update)
    update.add_argument(
        "--clear",
        default=None,
        help=f"comma-separated fields to reset to unlimited/empty ({', '.join(_CLEARABLE)})",
    )
    rotate = actions.add_parser("rotate", help="new material for a key (printed once); the old stops")
    revoke = actions.add_parser("revoke", help="revoke a key (every replica refuses it within 1 s)")
    for parser in (show, update, rotate, revoke):
        parser.add_argument("key_id", help="the key's id (key_...)")
    for parser in (create, listing, show, update, rotate, revoke):
        _common(parser)
        parser.set_defaults(run=_run_keys)

    teams = commands.add_parser("teams", help="list, show, set and delete teams (their limits and budget)")
    team_actions = teams.add_subparsers(dest="teams_command", required=True)
    team_list = team_actions.add_parser("list", help="list teams")
    team_show = team_actions.add_parser("show", help="one team, with its spend this period")
    team_set = team_actions.add_parser("set", help="create or replace a team's limits and budget")
    _limit_options(team_set)
    team_delete = team_actions.add_parser("delete", help="delete a team (its keys stay, unlimited by it)")
    for parser in (team_show, team_set, team_delete):
        parser.add_argument("team", help="the team's name")
    for parser in (team_list, team_show, team_set, team_delete):
        _common(parser)
        parser.set_defaults(run=_run_teams)


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def _limits_body(args: argparse.Namespace) -> dict[str, Any]:
    body = {name: getattr(args, name) for name in _LIMITS if getattr(args, name) is not None}
    if args.budget_period is not None:
        body["budget_period"] = args.budget_period
    return body


def _key_body(args: argparse.Namespace) -> dict[str, Any]:
    body = _limits_body(args)
    for name in ("name", "team", "max_priority", *_QUOTAS):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    for name in ("models", "classes"):
        if getattr(args, name) is not None:
            body[name] = _csv(getattr(args, name))
    if args.expires_in is not None:
        body["expires_at"] = time.time() + args.expires_in
    if args.metadata is not None:
        pairs = [item.partition("=") for item in args.metadata]
        body["metadata"] = {k: v for k, _, v in pairs}
    if args.admin:
        body["scopes"] = ["admin"]
    for name in _csv(getattr(args, "clear", None)) or []:
        if name not in _CLEARABLE:
            raise ValueError(f"--clear: `{name}` cannot be cleared (one of {', '.join(_CLEARABLE)})")
        body[name] = [] if name in ("models", "classes") else {} if name == "metadata" else None
    return body


class _Failed(Exception):
    pass


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    key = args.admin_key or os.environ.get(ADMIN_KEY_ENV)
    if not key:
        raise _Failed(f"no admin key: set ${ADMIN_KEY_ENV} or pass --admin-key")
    try:
        response = httpx.request(
            method,
            args.url.rstrip("/") + path,
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise _Failed(f"cannot reach {args.url}: {exc}") from None
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise _Failed(f"{response.status_code}: {message}")
    return response.json()


def _run(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None) -> int:
    try:
        answer = _call(args, method, path, body)
    except _Failed as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
        return 0
    rows = answer["data"] if isinstance(answer, dict) and "data" in answer else [answer]
    if isinstance(answer, dict) and "key" in answer:
        print(f"key: {answer['key']}")
        print("(shown once: store it now; the gateway keeps only its hash)")
    if isinstance(answer, dict) and "deleted" in answer:
        print(f"deleted team {answer['deleted']}")
        return 0
    print(format_table(rows, teams=args.command == "teams"))
    return 0


def _run_keys(args: argparse.Namespace) -> int:
    action = args.keys_command
    try:
        body = _key_body(args) if action in ("create", "update") else None
    except ValueError as exc:
        print(f"switchyard: {exc}", file=sys.stderr)
        return 2
    if action == "create":
        return _run(args, "POST", "/admin/v1/keys", body)
    if action == "list":
        path = "/admin/v1/keys" + (f"?team={args.team}" if args.team else "")
        return _run(args, "GET", path, None)
    path = f"/admin/v1/keys/{args.key_id}"
    if action == "show":
        return _run(args, "GET", path, None)
    if action == "update":
        return _run(args, "PATCH", path, body)
    return _run(args, "POST", f"{path}/{action}", {})


def _run_teams(args: argparse.Namespace) -> int:
    action = args.teams_command
    if action == "list":
        return _run(args, "GET", "/admin/v1/teams", None)
    path = f"/admin/v1/teams/{args.team}"
    if action == "show":
        return _run(args, "GET", path, None)
    if action == "set":
        return _run(args, "PUT", path, _limits_body(args))
    return _run(args, "DELETE", path, None)


def _cell(value: Any) -> str:
    if value is None or value == [] or value == {}:  # unlimited, every model, none
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _state(row: dict[str, Any]) -> str:
    if row.get("revoked"):
        return "revoked"
    expires = row.get("expires_at")
    if expires is not None and time.time() >= expires:
        return "expired"
    return "active"


def format_table(rows: list[dict[str, Any]], teams: bool = False) -> str:
    columns = ["name"] if teams else ["id", "name", "team", "state", "models"]
    columns += ["rpm", "tpm", "max_parallel", "budget_usd", "budget_period", "spent_usd"]
    if not teams:
        columns.append("scopes")
    cells = [[_state(row) if c == "state" else _cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)
