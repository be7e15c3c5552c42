"""What the kubelet says each container holds, as plain data.

The kubelet's PodResources API lists, for every running pod, the device IDs
each container was allocated per resource name, after the kubelet's Allocate
call returned. It names pods by namespace and name (no uid), and it is the one
source that says which pod a grant went to: Allocate itself names devices only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Held:
    """One container's devices of one resource, as the kubelet lists them."""

    namespace: str
    pod: str
    container: str
    resource: str
    devices: frozenset[str]


def ours(held: Iterable[Held], resources: Iterable[str]) -> list[Held]:
    """The holdings of this plugin's resources: another plugin may name devices alike."""
    names = set(resources)
    return [h for h in held if h.resource in names and h.devices]


def listed(held: Iterable[Held]) -> set[tuple[str, str]]:
    """(namespace, name) of every pod the kubelet lists, devices or not.

    The kubelet adds a pod to the pods it lists before it admits it, and drops it
    once it rejected it: so of the pods that wait for devices, the one it lists is
    the one whose Allocate is under way.
    """
    return {(h.namespace, h.pod) for h in held}


def holding(held: Iterable[Held], devices: Iterable[str]) -> Held | None:
    """The container the kubelet shows holding every one of `devices`, if any."""
    wanted = frozenset(devices)
    return next((h for h in held if wanted <= h.devices), None)
