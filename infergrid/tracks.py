"""An InferenceService's tracks: stable, and a canary beside it, as the operator names them.

The operator runs each track as a Deployment (`<name>` and `<name>-canary`) behind one
Service `<name>`. The gateway splits requests between the tracks by the canary's weight, so
it must tell, from an EndpointSlice of that Service (which names pods, not their labels),
which track a pod belongs to. The pod's name says it: a Deployment's pods are named
`<deployment>-<template hash>-<suffix>`, the hash and suffix drawn from Kubernetes' safe
alphabet, which has no vowels, so a stable pod's name never continues `<name>-ca...`. When the
name is long, the API server cuts `<deployment>-<hash>-` to GENERATED_BASE characters before
the suffix; the tracks stay apart while two characters of the hash survive the cut, hence
MAX_NAME_WITH_CANARY.
"""

from __future__ import annotations

from typing import Final

STABLE: Final = "stable"
CANARY: Final = "canary"
TRACKS: Final = (STABLE, CANARY)

# Kubernetes' generateName: a base of at most 58 characters, then 5 random ones.
GENERATED_BASE: Final = 58
SUFFIX: Final = 5
SAFE_ALPHABET: Final = frozenset("bcdfghjklmnpqrstvwxz2456789")
# The longest service name whose canary pods can be told from its stable ones.
MAX_NAME_WITH_CANARY: Final = GENERATED_BASE - 3


def deployment_name(service: str, track: str) -> str:
    """The Deployment that runs `track` of the InferenceService named `service`."""
    return service if track == STABLE else f"{service}-{CANARY}"


def track_of_pod(service: str, pod_name: str) -> str | None:
    """The track of a pod behind the Service `service`, or None for a pod that neither of the
    service's Deployments made."""
    for track in (CANARY, STABLE):
        if _made_by(deployment_name(service, track), pod_name):
            return track
    return None


def _made_by(deployment: str, pod_name: str) -> bool:
    """Whether `pod_name` is `<deployment>-<hash>-<suffix>`, cut as generateName cuts it."""
    base, suffix = pod_name[:-SUFFIX], pod_name[-SUFFIX:]
    if len(pod_name) <= SUFFIX or not set(suffix) <= SAFE_ALPHABET:
        return False
    head = f"{deployment}-"
    if len(base) == GENERATED_BASE and head.startswith(base):
        return True  # cut inside the deployment's name: only its prefix is left
    if not base.startswith(head):
        return False
    rest = base.removeprefix(head)  # "<hash>-", or a cut "<ha"
    cut = len(base) == GENERATED_BASE
    hash_part = rest.removesuffix("-") if rest.endswith("-") else rest if cut else None
    return bool(hash_part) and set(hash_part) <= SAFE_ALPHABET
