"""Every routing plugin by its `type` name: the built-ins are registered here, outside ones the same way.

A third-party module registers its own plugins when imported; a policy file names such modules under
`imports:`, so adding a plugin never means editing the engine:

    # mycompany/switchyard_plugins.py
    from policies.registry import register

    class PreferMyRack:
        name = "prefer-my-rack"
        scores_in_unit_range = True     # else the engine clamps its scores into 0..1
        reads_predictions = False       # True: the engine computes predicted TTFT/TPOT for it
        def score(self, ctx, candidates): ...

    register("prefer-my-rack", "scorer", PreferMyRack)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from policies.filters import ContextFits, ExcludeSaturated, Healthy
from policies.pickers import BestScore
from policies.scorers.affinity import PrefixAffinity, PrefixAffinityParams
from policies.scorers.cost import Cheapest
from policies.scorers.latency import FastestPredicted, SloPredicted
from policies.scorers.load import ClassOutstanding, ClassTokens, KvHeadroom, LeastOutstanding, PromptTokens

Kind = Literal["filter", "scorer", "picker"]


@dataclass(frozen=True, slots=True)
class PluginType:
    kind: Kind
    factory: Callable[..., Any]
    params: type[msgspec.Struct] | None
    """The parameters' schema; the factory receives one validated instance (or none without params)."""


_REGISTRY: dict[str, PluginType] = {}


def register(
    type_name: str, kind: Kind, factory: Callable[..., Any], params: type[msgspec.Struct] | None = None
) -> None:
    """Make a plugin type available to policy files. Registering a name twice replaces it."""
    _REGISTRY[type_name] = PluginType(kind, factory, params)


def lookup(type_name: str) -> PluginType | None:
    return _REGISTRY.get(type_name)


def registered(kind: Kind | None = None) -> list[str]:
    return sorted(name for name, plugin in _REGISTRY.items() if kind is None or plugin.kind == kind)


def create(type_name: str, params: dict[str, Any]) -> Any:
    """Instantiate a registered plugin; raises KeyError (unknown type) or msgspec.ValidationError."""
    plugin = _REGISTRY[type_name]
    if plugin.params is None:
        if params:
            raise msgspec.ValidationError(f"`{type_name}` takes no params")
        return plugin.factory()
    return plugin.factory(msgspec.convert(params, plugin.params, strict=True))


register("healthy", "filter", Healthy)
register("context-fits", "filter", ContextFits)
register("exclude-saturated", "filter", ExcludeSaturated)
register("least-outstanding", "scorer", LeastOutstanding)
register("kv-headroom", "scorer", KvHeadroom)
register("class-outstanding", "scorer", ClassOutstanding)
register("class-tokens", "scorer", ClassTokens)
register("prompt-tokens", "scorer", PromptTokens)
register("cheapest", "scorer", Cheapest)
register("slo-predicted", "scorer", SloPredicted)
register("fastest-predicted", "scorer", FastestPredicted)
register("prefix-affinity", "scorer", PrefixAffinity, PrefixAffinityParams)
register("best-score", "picker", BestScore)
