"""Route groups as Litestar controllers with their collaborators given per app (docs/internals.md).

A controller declares what it works with as annotated class attributes (`tenants: Tenants`); `per_app`
makes the subclass one app registers, those attributes set to that app's objects. Litestar creates the
controller instance itself and binds the handler methods to it, so a handler reads `self.tenants`, and
its signature lists only what the request carries (the console calls it in-process with just those).
"""

from __future__ import annotations

from types import FunctionType
from typing import Any, TypeVar, cast

from litestar import Controller

C = TypeVar("C", bound=type[Controller])

_LITESTAR_OWN = frozenset(Controller.__slots__) | frozenset(Controller.__annotations__)


def collaborators(controller: type[Controller]) -> frozenset[str]:
    """The names `controller` declares (annotated class attributes that are not Litestar's own)."""
    names: set[str] = set()
    for klass in controller.__mro__:
        if klass is Controller or not issubclass(klass, Controller):
            continue
        names.update(name for name in vars(klass).get("__annotations__", {}) if name not in _LITESTAR_OWN)
    return frozenset(names)


def per_app(controller: C, **given: Any) -> C:
    """A subclass of `controller` with `given` as its collaborators, all the declared ones (a missing or
    misspelt name fails here, when the app is built, not on a request). Litestar's own controller
    settings may be given too (`guards`, `request_max_body_size`) when they depend on the app's config."""
    declared = collaborators(controller)
    missing, unknown = declared - set(given), set(given) - declared - _LITESTAR_OWN
    if missing or unknown:
        raise TypeError(f"{controller.__name__}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    # A plain function kept on a class would come back bound to the instance: kept as given instead.
    attributes = {k: staticmethod(v) if isinstance(v, FunctionType) else v for k, v in given.items()}
    attributes["__module__"] = controller.__module__
    return cast(C, type(controller.__name__, (controller,), attributes))
