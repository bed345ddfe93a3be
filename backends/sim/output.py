"""What a request asks of its output beyond free text, honoured the way vLLM does: `stop` strings,
`logprobs`, `response_format` (JSON, or a value valid against a JSON schema) and tool calls.

The text generator (text.py) draws the words; this module shapes them: it cuts a choice at a stop string,
replaces its words by a JSON value or a tool call's arguments, and makes deterministic log probabilities.
Everything here depends only on the request, so the same request gets the same answer.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from backends.sim.text import VOCABULARY, Generation, tokenize

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_SCHEMA_DEPTH = 32


class OutputError(ValueError):
    """A request whose output options cannot be honoured; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolChoice:
    name: str
    arguments: str
    """A minimal JSON value valid against the function's `parameters`."""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """None: no log probabilities; else how many alternatives per token (0 for the token's own only)."""
    json_text: str | None = None
    """The answer's JSON: a minimal value valid against `response_format`'s schema (`{}` for
    `json_object`), worked out when the request is parsed so a bad schema is a 400."""
    tool: ToolChoice | None = None
    """The tool the answer calls (resolved from `tools` and `tool_choice` when parsed)."""

    @property
    def plain(self) -> bool:
        """Nothing asked beyond text: the stream's fast path applies."""
        return self.logprobs is None and self.tool is None


PLAIN = OutputSpec()


def parse_output(body: dict[str, Any], chat: bool) -> OutputSpec:
    stop = _stop(body.get("stop"))
    logprobs = _chat_logprobs(body) if chat else _completion_logprobs(body)
    schema = _response_format(body.get("response_format")) if chat else None
    json_text = None if schema is None else _json(minimal_instance(schema))
    tool = _tool(body, _last_user_text(body)) if chat else None
    if stop or logprobs is not None or json_text is not None or tool is not None:
        return OutputSpec(stop, logprobs, json_text, tool)
    return PLAIN


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise OutputError("`stop` must be a non-empty string or a list of non-empty strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise OutputError(f"`stop` takes at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(stops)


def _int_field(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise OutputError(f"`{name}` must be an integer from {low} to {high}", name)
    return value


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise OutputError("`logprobs` must be a boolean", "logprobs")
    if top is not None:
        top = _int_field(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if not wanted:
            raise OutputError("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    return (top or 0) if wanted else None


def _completion_logprobs(body: dict[str, Any]) -> int | None:
    value = body.get("logprobs")
    return None if value is None else _int_field(value, "logprobs", 0, MAX_TOP_LOGPROBS)


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise OutputError("`response_format.json_schema.schema` must be an object", "response_format")
        return schema
    raise OutputError(
        "`response_format.type` must be `text`, `json_object` or `json_schema`", "response_format"
    )


def _json(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _last_user_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _functions(tools: Any) -> dict[str, dict[str, Any]]:
    if tools is None:
        return {}
    if not isinstance(tools, list):
        raise OutputError("`tools` must be a list", "tools")
    functions: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise OutputError("each tool must be `{type: function, function: {name, parameters}}`", "tools")
        parameters = function.get("parameters")
        functions[function["name"]] = parameters if isinstance(parameters, dict) else {"type": "object"}
    return functions


def _tool(body: dict[str, Any], asked: str) -> ToolChoice | None:
    """The tool called: the one named by `tool_choice`; the first with `required`; with `auto` (the default
    when tools are given) the first whose name the last user message mentions; none with `none`."""
    functions = _functions(body.get("tools"))
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if name not in functions:
            raise OutputError("`tool_choice` names a function that is not in `tools`", "tool_choice")
        return ToolChoice(name, _json(minimal_instance(functions[name])))
    if choice not in (None, "auto", "none", "required"):
        raise OutputError(
            "`tool_choice` must be `none`, `auto`, `required` or a named function", "tool_choice"
        )
    if not functions or choice == "none":
        if choice == "required":
            raise OutputError("`tool_choice: required` needs `tools`", "tool_choice")
        return None
    if choice == "required":
        name = next(iter(functions))
        return ToolChoice(name, _json(minimal_instance(functions[name])))
    for name, parameters in functions.items():
        if name in asked:
            return ToolChoice(name, _json(minimal_instance(parameters)))
    return None


# --- shaping one choice -------------------------------------------------------------------------------


def shape(generation: Generation, spec: OutputSpec, max_tokens: int | None) -> Generation:
    """The choice as the options make it: a tool call's arguments, a JSON value, or text cut at a stop."""
    if spec.tool is not None:
        call_id = f"chatcmpl-tool-{os.urandom(16).hex()}"
        call = (call_id, spec.tool.name, spec.tool.arguments)
        return replace(_fixed_text(spec.tool.arguments, max_tokens), tool_call=call)
    if spec.json_text is not None:
        return _fixed_text(spec.json_text, max_tokens)
    if spec.stop:
        return _cut_at_stop(generation, spec.stop)
    return generation


def _fixed_text(text: str, max_tokens: int | None) -> Generation:
    """`text` as tokens, then the end-of-sequence token; cut (finish `length`) where max_tokens says."""
    tokens = tokenize(text)
    if max_tokens is not None and len(tokens) >= max_tokens:
        return Generation(tokens=tokens[:max_tokens], finish_reason="length")
    return Generation(tokens=[*tokens, ""], finish_reason="stop")


def _cut_at_stop(generation: Generation, stops: tuple[str, ...]) -> Generation:
    """Ends the choice where a stop string first appears. Like vLLM, the text stops before it, and the
    tokens up to the one that completed it count as generated (the ones past the cut carry no text)."""
    text = generation.text
    hits = [(at, stop) for at, stop in ((text.find(s), s) for s in stops) if at >= 0]
    if not hits:
        return generation
    at, stop = min(hits)
    stop_end = at + len(stop)
    kept: list[str] = []
    end = 0
    for token in generation.tokens:
        start, end = end, end + len(token)
        if end <= at:
            kept.append(token)
        elif start < at:
            kept.append(token[: at - start])
        else:
            kept.append("")
        if end >= stop_end:
            break
    return Generation(tokens=kept, finish_reason="stop", stop_reason=stop)


# --- JSON values ----------------------------------------------------------------------------------------


def minimal_instance(schema: dict[str, Any], root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A small value valid against `schema` (the subset structured outputs use: types, properties and
    `required`, items and `minItems`, enum and const, anyOf/oneOf/allOf, `$ref` into `$defs`, string and
    number bounds)."""
    root = schema if root is None else root
    if depth > MAX_SCHEMA_DEPTH:
        raise OutputError("the JSON schema nests too deep", "response_format")
    if "$ref" in schema:
        return minimal_instance(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if isinstance(o, dict) and o.get("type") != "null"] or options
            return minimal_instance(usable[0], root, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged.update(_resolve(part["$ref"], root) if "$ref" in part else part)
        return minimal_instance(merged, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _minimal_of_type(kind, schema, root, depth)


def _minimal_of_type(kind: str, schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    if kind == "object":
        properties = found if isinstance(found := schema.get("properties"), dict) else {}
        required = listed if isinstance(listed := schema.get("required"), list) else []
        return {name: minimal_instance(properties.get(name, {}), root, depth + 1) for name in required}
    if kind == "array":
        items = found if isinstance(found := schema.get("items"), dict) else {}
        count = least if isinstance(least := schema.get("minItems"), int) else 0
        return [minimal_instance(items, root, depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return _minimal_number(schema, kind == "integer")
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return _minimal_string(schema)


def _minimal_number(schema: dict[str, Any], integer: bool) -> float | int:
    value: float = 0
    if isinstance(schema.get("minimum"), int | float):
        value = max(value, schema["minimum"]) if "maximum" not in schema else schema["minimum"]
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        value = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    if isinstance(schema.get("maximum"), int | float) and value > schema["maximum"]:
        value = schema["maximum"]
    if isinstance(schema.get("exclusiveMaximum"), int | float) and value >= schema["exclusiveMaximum"]:
        value = schema["exclusiveMaximum"] - (1 if integer else 0.5)
    return int(value) if integer else float(value)


_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def _minimal_string(schema: dict[str, Any]) -> str:
    text = _FORMATS.get(schema.get("format", ""), "text")
    low = least if isinstance(least := schema.get("minLength"), int) else 0
    high = most if isinstance(most := schema.get("maxLength"), int) else None
    if len(text) < low:
        text = (text * (low // len(text) + 1))[:low]
    if high is not None:
        text = text[:high]
    return text


def _resolve(ref: Any, root: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise OutputError(f"unsupported $ref {ref!r} (only local `#/...` references)", "response_format")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        raise OutputError(f"$ref {ref!r} points at nothing", "response_format")
    return node


# --- log probabilities ------------------------------------------------------------------------------------


def logprob(token: str, position: int, rank: int = 0) -> float:
    """A deterministic log probability in (-4, 0]; alternatives (rank > 0) are always less likely."""
    spread = zlib.crc32(f"{position}\x1f{token}".encode()) % 1000 / 1000
    return round(-(spread * 0.5 + rank * 0.75), 6)


def alternatives(token: str, position: int, count: int) -> list[tuple[str, float]]:
    """The token itself and `count - 1` other vocabulary words, most likely first."""
    picks = [token]
    start = zlib.crc32(f"{position}\x1f{token}".encode())
    for step in range(len(VOCABULARY)):
        if len(picks) >= count:
            break
        word = " " + VOCABULARY[(start + step * 7) % len(VOCABULARY)]
        if word not in picks:
            picks.append(word)
    return [(word, logprob(token, position, rank)) for rank, word in enumerate(picks[:count])]


def chat_token_logprobs(token: str, position: int, top: int) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "token": token,
        "logprob": logprob(token, position),
        "bytes": list(token.encode()),
    }
    entry["top_logprobs"] = [
        {"token": word, "logprob": value, "bytes": list(word.encode())}
        for word, value in alternatives(token, position, top)
    ]
    return entry


def completion_logprobs(tokens: list[str], top: int, offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy completions shape: parallel lists, `top_logprobs` a dict per token."""
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": [logprob(t, offset + i) for i, t in enumerate(tokens)],
        "tokens": tokens,
        "top_logprobs": [dict(alternatives(t, offset + i, max(top, 1))) for i, t in enumerate(tokens)],
    }
