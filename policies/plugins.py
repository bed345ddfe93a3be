"""The plugins one policy can name: every registered plugin that needs no parameters, under its type name,
plus the instances the policy's `plugins:` section configures, after importing its `imports:` modules."""

from __future__ import annotations

import importlib
from typing import Any

import msgspec

from backends.yamlfile import ConfigError
from policies import registry
from policies.config import LoadedPolicy
from policies.framework import Scorer


class PolicyPlugins:
    def __init__(self, loaded: LoadedPolicy) -> None:
        self.loaded = loaded
        self._kinds: dict[str, str] = {}
        self._import()
        self._plugins = self._build()

    def _import(self) -> None:
        for i, module in enumerate(self.loaded.policy.imports):
            try:
                importlib.import_module(module)
            except Exception as exc:  # a plugin module may fail in any way while importing
                raise ConfigError(
                    self.loaded.source, self.loaded.line("imports", i), f"cannot import `{module}`: {exc}"
                ) from None

    def _build(self) -> dict[str, Any]:
        """Every registered plugin that works with default parameters, under its type name, plus the
        policy's configured instances."""
        plugins: dict[str, Any] = {}
        for type_name in registry.registered():
            entry = registry.lookup(type_name)
            if entry is None:
                continue
            try:
                plugins[type_name] = registry.create(type_name, {})
            except msgspec.ValidationError:
                continue  # needs parameters: only usable through a `plugins:` entry
            self._kinds[type_name] = entry.kind
        for i, spec in enumerate(self.loaded.policy.plugins):
            entry = registry.lookup(spec.type)
            if entry is None:
                known = ", ".join(registry.registered())
                raise ConfigError(
                    self.loaded.source,
                    self.loaded.line("plugins", i, "type"),
                    f"unknown plugin type `{spec.type}`",
                    hint=f"one of: {known}",
                )
            try:
                plugin = registry.create(spec.type, spec.params)
            except msgspec.ValidationError as exc:
                raise ConfigError(
                    self.loaded.source,
                    self.loaded.line("plugins", i, "params"),
                    f"bad params for `{spec.type}`: {exc}",
                ) from None
            plugins[spec.name or spec.type] = plugin
            self._kinds[spec.name or spec.type] = entry.kind
        return plugins

    def get(self, name: str, kind: str, *path: Any) -> Any:
        """The plugin `name` of this kind; a ConfigError at `path` (the policy file's line) when none is."""
        if self._kinds.get(name) != kind:
            known = ", ".join(sorted(n for n, k in self._kinds.items() if k == kind))
            raise ConfigError(
                self.loaded.source,
                self.loaded.line(*path),
                f"unknown {kind} `{name}`",
                hint=f"one of: {known}",
            )
        return self._plugins[name]

    def scorer(self, name: str, *path: Any) -> Scorer:
        """The scorer named in a route's strategy, which must declare its capabilities (framework.Scorer)."""
        scorer = self.get(name, "scorer", *path)
        missing = [
            attr
            for attr in ("scores_in_unit_range", "reads_predictions")
            if not isinstance(getattr(scorer, attr, None), bool)
        ]
        if missing:
            raise ConfigError(
                self.loaded.source,
                self.loaded.line(*path),
                f"scorer `{name}` ({type(scorer).__module__}.{type(scorer).__qualname__}) does not declare "
                + " and ".join(f"`{attr}`" for attr in missing),
                hint="a scorer sets both as class attributes, True or False (policies/framework.py Scorer)",
            )
        return scorer
