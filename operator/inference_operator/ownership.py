"""Whether an object of the InferenceService's children's names is this service's to write.

Children have fixed names (`<name>`, `<name>-canary`, ...), so a service could be named
after an object someone else made: `kubernetes` in `default`, or `web` beside an
unrelated `web-canary`, or `a-canary` beside the canary of `a`. The operator writes or
deletes an object only when its ownerReferences name this InferenceService's UID as the
controller; anything else is refused, naming the object. Pure: the handlers read the
objects and pass them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with controller: true; the API allows at most one."""
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    ref = controller(obj)
    return ref is not None and ref.get("uid") == uid


def refusal(kind: str, obj: Mapping[str, Any] | None, uid: str) -> str:
    """Why this service may not write `obj` (empty when it may: absent, or its own)."""
    if obj is None or controlled_by(obj, uid):
        return ""
    name = obj["metadata"]["name"]
    ref = controller(obj)
    if ref is None:
        return f"{kind}/{name} exists and no controller owns it"
    return f"{kind}/{name} exists and belongs to {ref.get('kind')}/{ref.get('name')}"


def conflicts(
    children: Iterable[Mapping[str, Any]],
    existing: Mapping[tuple[str, str], Mapping[str, Any] | None],
    uid: str,
) -> list[str]:
    """One line per child whose name is taken by an object this service does not control.

    `existing` holds what the API returned for each child's (kind, name), None if absent.
    """
    keys = [(c["kind"], c["metadata"]["name"]) for c in children]
    found = (refusal(kind, existing.get((kind, name)), uid) for kind, name in keys)
    return [line for line in found if line]


def conflict_message(lines: list[str]) -> str:
    """The condition's message: what is in the way, and what to do about it."""
    return (
        "; ".join(lines) + ": the operator writes only objects this InferenceService "
        "controls; rename the InferenceService or remove the object, then change the spec "
        "to retry"
    )
