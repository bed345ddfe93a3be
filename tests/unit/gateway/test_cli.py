"""`switchyard`: every option explains itself; a closed pipe ends a command quietly; `policy` subcommands."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from gateway.cli import main as cli
from policies.explain import Explained

ROOT = Path(__file__).resolve().parents[3]
REQUEST = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


def _parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_every_option_of_every_command_has_help():
    missing = []
    for name, parser in _parsers(cli.build_parser(), "switchyard"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.nargs == argparse.REMAINDER:
                continue  # commands list their own help; a pass-through goes to a parser with its own
            if not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def _request(tmp_path: Path) -> Path:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(REQUEST))
    return path


def test_output_to_a_closed_pipe_ends_quietly(tmp_path):
    request = str(_request(tmp_path))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written, as after `| head -1`
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "policy",
                "explain",
                "balanced",
                "--request",
                request,
                "--json",
            ],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == cli.EXIT_BROKEN_PIPE


def test_policy_check_fails_on_a_selector_matching_no_pool(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("name: t\nroutes:\n  default:\n    prefer: {accelerator: mi250}\n    fallback: any\n")
    assert cli.main(["policy", "check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert f"warning: {path}:4: route `default`: prefer {{accelerator: mi250}} matches no pool" in out.err
    assert "error: policy `t`" in out.err


def test_policy_explain_rejects_unknown_state_fields(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"h100-0": {"queue": 3}}))
    code = cli.main(
        ["policy", "explain", "balanced", "--request", str(_request(tmp_path)), "--state", str(state)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "backend `h100-0`" in err and "unknown field `queue`" in err
    assert "allowed fields: healthy, inflight, inflight_seqs, running, waiting, kv_cache_usage" in err


def test_policy_explain_rejects_a_state_value_of_the_wrong_type(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"h100-0": {"inflight": "many"}}))
    code = cli.main(
        ["policy", "explain", "balanced", "--request", str(_request(tmp_path)), "--state", str(state)]
    )
    assert code == 1
    assert "backend `h100-0`" in capsys.readouterr().err


def test_policy_explain_rejects_negative_sequences_in_flight(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"h100-0": {"inflight": 2, "inflight_seqs": -1}}))
    code = cli.main(
        ["policy", "explain", "balanced", "--request", str(_request(tmp_path)), "--state", str(state)]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "backend `h100-0`" in err and "inflight_seqs" in err and ">= 0" in err


def test_policy_explain_shows_the_seats_a_backends_requests_hold(tmp_path, capsys):
    """A batch job (n=4) and a state where h100-0's 64 requests hold 256 sequences: past balanced's batch
    mark, said in the sequences; a backend given only `inflight` holds one sequence per request."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": REQUEST["model"], "messages": REQUEST["messages"], "n": 4}))
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps({"h100-0": {"inflight": 64, "inflight_seqs": 256}, "h100-1": {"inflight": 5}})
    )
    args = ["policy", "explain", "balanced", "--request", str(job), "--state", str(state), "--json"]
    assert cli.main(args) == 0
    explained = msgspec.json.decode(capsys.readouterr().out, type=Explained)
    assert explained.explanation is not None
    candidates = {c.backend: c for c in explained.explanation.candidates}
    assert candidates["h100-0"].inflight_seqs == 256
    assert candidates["h100-0"].why_not == "256 sequences in flight (limit 256)"
    assert not candidates["h100-0"].can_take_more
    assert candidates["h100-1"].inflight_seqs == 5 and candidates["h100-1"].can_take_more


def test_policy_explain_applies_the_state(tmp_path, capsys):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"mi300x-0": {"healthy": False}, "mi300x-1": {"waiting": 9}}))
    args = ["policy", "explain", "balanced", "--request", str(_request(tmp_path)), "--state", str(state)]
    assert cli.main([*args, "--json"]) == 0
    explained = msgspec.json.decode(capsys.readouterr().out, type=Explained)  # the admin endpoint's type
    assert explained.explanation is not None
    assert [(d.backend, d.reason) for d in explained.explanation.dropped] == [
        ("mi300x-0", "failed its health check")
    ]
    notes = {c.backend: c.why_not for c in explained.explanation.candidates}
    assert "9 requests waiting" in (notes["mi300x-1"] or "")
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "dropped mi300x-0: failed its health check" in out
    assert f"choice: {explained.order[0]}" in out


@pytest.mark.parametrize("command", [["demo"], ["costs"], ["backends"]])
def test_help_of_the_commands_the_issue_named(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    out = capsys.readouterr().out
    assert "(default:" in out or "drain one" in out


def test_policy_explain_shows_a_long_prompt_held_while_a_backend_decodes_slowly(tmp_path, capsys):
    """`balanced`'s long-context mark on the demo fleet (8B): an MI300X measured at 70 ms a token with work
    in flight takes no more long prompts (6x its 9 ms at light load: 54 ms); an idle one measured as slow
    does."""
    long_prompt = tmp_path / "long.json"
    words = "word " * 12_000
    long_prompt.write_text(
        json.dumps({"model": REQUEST["model"], "messages": [{"role": "user", "content": words}]})
    )
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"mi300x-0": {"inflight": 20, "tpot_ms": 70}, "mi300x-1": {"tpot_ms": 70}}))
    args = ["policy", "explain", "balanced", "--request", str(long_prompt), "--state", str(state), "--json"]
    assert cli.main(args) == 0
    explained = msgspec.json.decode(capsys.readouterr().out, type=Explained)
    assert explained.explanation is not None and explained.explanation.request_class == "long-context"
    candidates = {c.backend: c for c in explained.explanation.candidates}
    assert candidates["mi300x-0"].why_not == "decoding at 70 ms per token (limit 54 ms)"
    assert not candidates["mi300x-0"].can_take_more
    assert candidates["mi300x-1"].can_take_more  # idle: its measurement is of a load that has gone
    assert explained.explanation.choice == "mi300x-1"
