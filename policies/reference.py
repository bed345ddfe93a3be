"""The plugin reference: every registered filter, scorer and picker, with what it does and its parameters.

Read from the registry, each plugin's docstring and its parameter schema (a field's description is the
docstring under it), so the reference cannot drift from the code. `switchyard policy plugins` prints it;
`--markdown` is docs/plugins.md, which a test keeps equal to this output.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from dataclasses import dataclass

import msgspec
import msgspec.inspect as mi

from policies import registry

KINDS: tuple[registry.Kind, ...] = ("filter", "scorer", "picker")
REGENERATE = "switchyard policy plugins --markdown > docs/plugins.md"
ALWAYS_RUN = ("healthy", "context-fits")
"""The filters the engine puts first on every route (policies/engine.py `_compile_route`)."""

_INTRO = {
    "filter": (
        "A filter drops the backends that must not get the request, and says why (`policy explain` shows "
        "it). `healthy` and `context-fits` run first on every route; a route adds others by name: "
        "`filters: [exclude-saturated]`."
    ),
    "scorer": (
        "A scorer rates every remaining candidate in 0..1 (1 best). A route names its scorers with a "
        "weight each, `strategy: {slo-predicted: 2, least-outstanding: 1}`; the weights are normalised "
        "and the weighted scores summed. Without `strategy` a route uses `least-outstanding`."
    ),
    "picker": (
        "A picker orders the scored candidates: the first is tried first, the rest are the fallbacks. "
        "A route names one with `picker:` (default `best-score`)."
    ),
}


@dataclass(frozen=True, slots=True)
class ParamDoc:
    name: str
    type: str
    default: str | None
    """None when the parameter is required."""
    description: str


@dataclass(frozen=True, slots=True)
class PluginDoc:
    name: str
    kind: registry.Kind
    source: str
    """Where the plugin is defined: module.Class."""
    description: str
    params: list[ParamDoc]
    reads_predictions: bool


def plugin_docs() -> list[PluginDoc]:
    """Every registered plugin, by kind, then name."""
    docs = []
    for kind in KINDS:
        for name in registry.registered(kind):
            plugin = registry.lookup(name)
            assert plugin is not None
            factory = plugin.factory
            docs.append(
                PluginDoc(
                    name=name,
                    kind=kind,
                    source=f"{factory.__module__}.{factory.__qualname__}",
                    description=inspect.cleandoc(factory.__doc__ or ""),
                    params=[] if plugin.params is None else param_docs(plugin.params),
                    reads_predictions=bool(getattr(factory, "reads_predictions", False)),
                )
            )
    return docs


def param_docs(schema: type[msgspec.Struct]) -> list[ParamDoc]:
    """The schema's fields with their type, default and description (the docstring under the field)."""
    described = _field_docstrings(schema)
    info = mi.type_info(schema)
    assert isinstance(info, mi.StructType)
    params = []
    for field in info.fields:
        if field.required:
            default = None
        elif field.default is not msgspec.NODEFAULT:
            default = repr(field.default)
        else:
            default = repr(field.default_factory())
        params.append(ParamDoc(field.name, _type_name(field.type), default, described.get(field.name, "")))
    return params


def _field_docstrings(schema: type) -> dict[str, str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(schema)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found = {}
    for field, after in itertools.pairwise(body):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[field.target.id] = inspect.cleandoc(after.value.value)
    return found


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def _type_name(t: mi.Type) -> str:
    if isinstance(t, mi.UnionType):
        return " | ".join(_type_name(member) for member in t.types)
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.ListType):
        return f"list of {_type_name(t.item_type)}"
    if isinstance(t, mi.LiteralType):
        return " | ".join(repr(value) for value in t.values)
    name = {mi.IntType: "int", mi.FloatType: "float", mi.StrType: "string", mi.BoolType: "bool"}.get(
        type(t), type(t).__name__.removesuffix("Type").lower()
    )
    bounds = [f"{sign} {getattr(t, attr)}" for attr, sign in _BOUNDS if getattr(t, attr, None) is not None]
    return f"{name} ({', '.join(bounds)})" if bounds else name


def _usage(doc: PluginDoc) -> str:
    if doc.name in ALWAYS_RUN:
        return "runs first on every route"
    if doc.kind == "filter":
        return f"filters: [{doc.name}]"
    if doc.kind == "scorer":
        return f"strategy: {{{doc.name}: 1}}"
    return f"picker: {doc.name}"


def _configured(doc: PluginDoc) -> str:
    params = ", ".join(f"{p.name}: {p.default or '...'}" for p in doc.params)
    return f"plugins: [{{type: {doc.name}, name: my-{doc.name}, params: {{{params}}}}}]"


def _notes(doc: PluginDoc) -> list[str]:
    notes = []
    if doc.reads_predictions:
        notes.append(
            "Reads the predicted TTFT and time per token (policies/predict.py), which a route using it "
            "computes once per request."
        )
    if any(p.default is None for p in doc.params):
        notes.append("Has required parameters: use it through a `plugins:` entry, by that entry's name.")
    elif doc.params:
        notes.append(
            "By its type name it runs with the defaults; for other values add a `plugins:` entry and "
            "use the entry's name."
        )
    return notes


def markdown(docs: list[PluginDoc]) -> str:
    lines = [
        "# Plugin reference",
        "",
        f"<!-- Generated from policies/registry.py and the plugins' docstrings: `{REGENERATE}`. -->",
        "",
        "Every filter, scorer and picker a policy file can name, as registered in `policies/registry.py`. "
        "One scheduling cycle per request: the class's route filters the backends, scores the rest, and "
        "its picker orders them ([Routing policies](routing.md#how-a-decision-is-made)). A module listed "
        "under a policy file's `imports:` can register more (`policies.registry.register`); "
        "`switchyard policy plugins --import MODULE` lists them too.",
    ]
    for kind in KINDS:
        lines += ["", f"## {kind.capitalize()}s", "", _INTRO[kind]]
        for doc in (d for d in docs if d.kind == kind):
            lines += ["", f"### `{doc.name}`", "", doc.description or "(no description)", ""]
            usage = _usage(doc) if doc.name in ALWAYS_RUN else f"in a route: `{_usage(doc)}`"
            lines += [f"{usage[0].upper()}{usage[1:]}. Defined in `{doc.source}`."]
            for note in _notes(doc):
                lines += ["", note]
            if doc.params:
                lines += [
                    "",
                    f"Configured: `{_configured(doc)}`, then `my-{doc.name}` in place of its type name.",
                    "",
                ]
                lines += ["| parameter | type | default | what |", "|---|---|---|---|"]
                for p in doc.params:
                    default = "required" if p.default is None else f"`{p.default}`"
                    what = " ".join(p.description.split()).replace("|", "\\|")
                    lines.append(f"| `{p.name}` | {p.type} | {default} | {what} |")
    return "\n".join(lines) + "\n"


def text(docs: list[PluginDoc]) -> str:
    """The reference for a terminal."""
    lines: list[str] = []
    for kind in KINDS:
        if lines:
            lines.append("")
        lines.append(f"{kind.upper()}S")
        lines += textwrap.wrap(_INTRO[kind], 100, break_on_hyphens=False)
        for doc in (d for d in docs if d.kind == kind):
            lines += ["", f"  {doc.name}    {_usage(doc)}    ({doc.source})"]
            for paragraph in [*(doc.description or "(no description)").split("\n\n"), *_notes(doc)]:
                lines += textwrap.wrap(
                    " ".join(paragraph.split()),
                    100,
                    initial_indent="    ",
                    subsequent_indent="    ",
                    break_on_hyphens=False,
                )
            for p in doc.params:
                default = "required" if p.default is None else f"default {p.default}"
                lines.append(f"    param {p.name}: {p.type}, {default}")
                lines += textwrap.wrap(
                    " ".join(p.description.split()),
                    100,
                    initial_indent="      ",
                    subsequent_indent="      ",
                    break_on_hyphens=False,
                )
    return "\n".join(lines) + "\n"
