"""What a model name means to one caller: the route it reaches, if any.

Tenants choose their models' names, so a name is not global: team-a naming its service's
model like team-b's must never get team-b's callers. A caller is routed only inside the
namespaces it may call (its key's `namespaces`, within those the gateway watches), by one
of two forms of a name:

- `namespace/model`, the qualified name, reaches that namespace's model and nothing else.
  A name whose part before the first `/` is a namespace the caller may call is always read
  so, even when that namespace serves no such model right now (it is being re-created): it
  is then unknown, never resolved elsewhere.
- `model` alone reaches the one namespace among those the caller may call that serves it;
  served by several, it is ambiguous, and the answer lists the qualified names. A model
  whose own name holds a `/` ("org/name") is reached this way when `org` is not a namespace
  the caller may call, else by its qualified name ("namespace/org/name").

Pure: the catalog and the caller's predicate in, a route or `Unresolved` out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from gateway.catalog import Catalog, Route
from gateway.request_body import with_member

MayCall = Callable[[str], bool]  # namespace -> whether the caller may call it
_NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS label


class Unresolved(Exception):
    """No route for the name: unknown (`choices`: every name the caller may use) or
    ambiguous (`choices`: the qualified names it may pick from)."""

    def __init__(self, ambiguous: bool, choices: tuple[str, ...]) -> None:
        super().__init__("ambiguous" if ambiguous else "unknown")
        self.ambiguous, self.choices = ambiguous, choices


def qualified(route: Route) -> str:
    return f"{route.namespace}/{route.model}"


def resolve(catalog: Catalog, name: str, may_call: MayCall) -> Route:
    """The route `name` reaches for this caller; Unresolved when none or several."""
    meant = _meant(catalog, name, may_call)
    if len(meant) == 1:
        return meant[0]
    if meant:
        raise Unresolved(True, tuple(qualified(r) for r in meant))
    raise Unresolved(False, tuple(names(catalog, may_call)))


def names(catalog: Catalog, may_call: MayCall) -> dict[str, Route]:
    """Every name the caller may use, each with its route: first each bare name that
    resolves, which is what most clients send, then the qualified name of each model of a
    namespace it may call; each part sorted."""
    routes = sorted((r for r in catalog.routes.values() if may_call(r.namespace)), key=qualified)
    bare: dict[str, Route] = {}
    for route in routes:
        if len(meant := _meant(catalog, route.model, may_call)) == 1:
            bare[route.model] = meant[0]
    return {**dict(sorted(bare.items())), **{qualified(r): r for r in routes}}


def _meant(catalog: Catalog, name: str, may_call: MayCall) -> tuple[Route, ...]:
    """The routes the name may mean to the caller, by the module's two rules."""
    namespace, slash, model = name.partition("/")
    if slash and _NAMESPACE.fullmatch(namespace) and may_call(namespace):
        route = catalog.routes.get((namespace, model))
        return (route,) if route is not None else ()
    return tuple(r for r in catalog.by_model.get(name, ()) if may_call(r.namespace))


def as_served(raw: bytes, name: str, route: Route) -> bytes:
    """The body an engine gets. An engine checks `model` against the one name it serves, so a
    caller's qualified name is replaced by the route's model, appended as the object's last
    member (`request_body.with_member`); a body naming the model as the engine does goes byte
    for byte."""
    if name == route.model:
        return raw
    return with_member(raw, "model", route.model)
