"""Load a YAML file into a msgspec Struct, with errors that name the file and line to fix.

msgspec validates the whole document in one pass but reports positions as JSON paths
(`$.pools[0].vendor`). We compose the YAML ourselves so every path can be mapped back to the
line of the node an operator has to edit.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

T = TypeVar("T")

_PATH_RE = re.compile(r" - at `(\$[^`]*)`$")
_PATH_PART_RE = re.compile(r"\.([A-Za-z_][\w-]*)|\[(\d+)\]")
_HIDDEN_KEY = "[...]"
_UNKNOWN_FIELD_RE = re.compile(r"^Object contains unknown field `([^`]+)`")


class ConfigError(ValueError):
    """A config or policy file that cannot be used; the message says where and why."""

    def __init__(self, source: str, line: int | None, message: str, hint: str | None = None) -> None:
        self.source = source
        self.line = line
        self.reason = message
        self.hint = hint
        where = f"{source}:{line}" if line is not None else source
        text = f"{where}: {message}"
        if hint:
            text += f" (hint: {hint})"
        super().__init__(text)


def _to_python(node: yaml.Node, lines: dict[tuple[Any, ...], int], path: tuple[Any, ...], source: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _construct(key_node)
            if key in out:
                raise ConfigError(source, key_node.start_mark.line + 1, f"duplicate key `{key}`")
            lines[(*path, ("key", key))] = key_node.start_mark.line + 1
            out[key] = _to_python(value_node, lines, (*path, key), source)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(item, lines, (*path, i), source) for i, item in enumerate(node.value)]
    return _construct(node)


def _construct(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def read_text(path: str | Path, what: str) -> str:
    """A config-like file's text; ConfigError naming the file when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read {what}: {exc.strerror}") from None


def parse_yaml(text: str, source: str) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Parse YAML text into plain Python data plus a map from data path to line number."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        if mark is not None and not text[mark.index :].strip():
            # At the end of the stream the mark sits past the last newline: name the last line with text.
            line = text[: mark.index].rstrip().count("\n") + 1
        raise ConfigError(source, line, f"invalid YAML: {exc.problem or exc}") from None
    lines: dict[tuple[Any, ...], int] = {}
    if root is None:
        return {}, lines
    return _to_python(root, lines, (), source), lines


def _line_for(
    path_text: str, lines: dict[tuple[Any, ...], int], unknown_key: str | None, prefix: tuple[Any, ...] = ()
) -> int | None:
    path: list[Any] = list(prefix)
    for name, index in _PATH_PART_RE.findall(path_text):
        path.append(int(index) if index else name)
    if unknown_key is not None and (*path, ("key", unknown_key)) in lines:
        return lines[(*path, ("key", unknown_key))]
    while True:
        if tuple(path) in lines:
            return lines[tuple(path)]
        if not path:
            return None
        path.pop()


def _reveal_keys(data: Any, schema: type[Any], path_text: str, reason: str) -> str:
    """msgspec writes a mapping's key as `[...]`; find the key by re-validating one entry at a time.

    Only runs for an error, at load time: the culprit is the entry whose one-entry mapping fails the
    same way.
    """
    while _HIDDEN_KEY in path_text:
        head, _, tail = path_text.partition(_HIDDEN_KEY)
        parts = [int(i) if i else n for n, i in _PATH_PART_RE.findall(head)]
        target = data
        for part in parts:
            target = target[part]
        if not isinstance(target, dict):
            return path_text
        found = None
        for key in target:
            trial = copy.deepcopy(data)
            holder = trial
            for part in parts:
                holder = holder[part]
            holder.clear()
            holder[key] = target[key]
            try:
                msgspec.convert(trial, schema, strict=True)
            except msgspec.ValidationError as exc:
                if str(exc).startswith(reason):
                    found = key
                    break
        if found is None or not re.fullmatch(r"[A-Za-z_][\w-]*", str(found)):
            return path_text
        path_text = f"{head}.{found}{tail}"
    return path_text


def decode(
    data: Any, lines: dict[tuple[Any, ...], int], schema: type[T], source: str, prefix: tuple[Any, ...] = ()
) -> T:
    """Validate parsed data against `schema`, raising ConfigError pointing at the offending line.

    `prefix` is where `data` sits in the file, for validating one entry of a mapping on its own (msgspec
    reports a mapping's keys as `[...]`, which cannot be traced back to a line).
    """
    try:
        return msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_RE.search(text)
        path_text = match.group(1) if match else "$"
        reason = text[: match.start()] if match else text
        if _HIDDEN_KEY in path_text:
            path_text = _reveal_keys(data, schema, path_text, reason)
        unknown = _UNKNOWN_FIELD_RE.match(reason)
        line = _line_for(path_text, lines, unknown.group(1) if unknown else None, prefix)
        inner = path_text.removeprefix("$").lstrip(".")
        where = ".".join([*(str(p) for p in prefix), *([inner] if inner else [])]) or "top level"
        raise ConfigError(source, line, f"{reason} (at {where})") from None
