"""Which backends serve which model: the index the router starts from."""

from __future__ import annotations

from collections.abc import Iterable

from backends.models import Backend


class Catalog:
    """An immutable view of the configured backends, indexed by served model name."""

    __slots__ = ("_by_model", "backends")

    def __init__(self, backends: Iterable[Backend]) -> None:
        self.backends: tuple[Backend, ...] = tuple(backends)
        by_model: dict[str, list[Backend]] = {}
        for backend in self.backends:
            for model in backend.models:
                by_model.setdefault(model, []).append(backend)
        self._by_model = {model: tuple(group) for model, group in by_model.items()}

    def serving(self, model: str) -> tuple[Backend, ...]:
        return self._by_model.get(model, ())

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def max_model_len(self, model: str) -> int:
        return max((b.max_model_len for b in self.serving(model)), default=0)
