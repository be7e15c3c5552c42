"""Which track a pod behind an InferenceService's Service belongs to, from its name alone.

A Deployment's pods are named `<deployment>-<template hash>-<suffix>`; when that is long, the
API server's generateName cuts `<deployment>-<hash>-` to 58 characters and adds 5 random ones.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.tracks import (
    CANARY,
    GENERATED_BASE,
    MAX_NAME_WITH_CANARY,
    SAFE_ALPHABET,
    STABLE,
    SUFFIX,
    TRACKS,
    deployment_name,
    track_of_pod,
)

SAFE = "".join(sorted(SAFE_ALPHABET))


def pod_name(deployment: str, template_hash: str, suffix: str) -> str:
    """The name the API server gives a pod of `deployment`'s ReplicaSet (generateName)."""
    return f"{deployment}-{template_hash}-"[:GENERATED_BASE] + suffix


def test_the_alphabet_is_kubernetes_safe_alphabet_without_vowels():
    assert SAFE == "2456789bcdfghjklmnpqrstvwxz"
    assert not SAFE_ALPHABET & set("aeiou")


def test_the_tracks_deployments():
    assert TRACKS == (STABLE, CANARY)
    assert deployment_name("chat", STABLE) == "chat"
    assert deployment_name("chat", CANARY) == "chat-canary"


@pytest.mark.parametrize(
    ("pod", "track"),
    [
        ("chat-7d9f8b6c5-x2kzq", STABLE),
        ("chat-canary-5b7c9d8f4-bcdfg", CANARY),
        ("chat-c-bcdfg", STABLE),  # a one-character hash that begins like "canary"
        ("chat-canary-c-bcdfg", CANARY),
    ],
)
def test_a_pod_of_each_track(pod, track):
    assert track_of_pod("chat", pod) == track


@pytest.mark.parametrize(
    "pod",
    [
        "chatbot-7d9f8b6c5-x2kzq",  # another service's Deployment
        "chat-canary2-7d9f8b6c5-x2kzq",
        "chat-bcd-7d9f8b6c5-x2kzq",  # a Deployment "chat-bcd": its hash holds a "-"
        "other-7d9f8b6c5-x2kzq",
        "chat-x2kzq",  # no template hash
        "chat--x2kzq",
        "chat-7d9f8b6c5-x2kzA",  # a suffix outside the safe alphabet
        "chat-7d9f8b6c5-x2kz",
        "chat-7d9fab6c5-x2kzq",  # a vowel: no template hash
        "x2kzq",
        "",
    ],
)
def test_a_pod_of_no_track_of_the_service(pod):
    assert track_of_pod("chat", pod) is None


def test_names_cut_at_58_characters_keep_their_track():
    name = "s" * MAX_NAME_WITH_CANARY
    stable = pod_name(name, "7d9f8b6c5", "x2kzq")
    canary = pod_name(deployment_name(name, CANARY), "5b7c9d8f4", "bcdfg")
    assert len(stable) == len(canary) == GENERATED_BASE + SUFFIX
    assert stable == name + "-7d" + "x2kzq"  # two of the hash's characters left
    assert canary == name + "-ca" + "bcdfg"  # cut inside the canary Deployment's name
    assert track_of_pod(name, stable) == STABLE
    assert track_of_pod(name, canary) == CANARY


def test_a_cut_name_of_another_service_is_no_track():
    name = "s" * MAX_NAME_WITH_CANARY
    assert track_of_pod(name, pod_name("t" + name[1:], "7d9f8b6c5", "x2kzq")) is None
    assert track_of_pod(name[:-1], pod_name(name, "7d9f8b6c5", "x2kzq")) is None


def test_one_character_more_and_a_stable_pod_could_read_as_a_canary():
    """Why MAX_NAME_WITH_CANARY is what it is: one more character, and a hash cut to its "c"
    leaves a stable pod's name a prefix of the canary Deployment's."""
    name = "s" * (MAX_NAME_WITH_CANARY + 1)
    assert track_of_pod(name, pod_name(name, "c7d9f8b6c5", "x2kzq")) == CANARY


# DNS-1035 labels: a lowercase letter, then letters, digits and '-', not ending with '-'.
service_names = st.from_regex(r"[a-z]([-a-z0-9]*[a-z0-9])?", fullmatch=True).filter(
    lambda name: len(name) <= MAX_NAME_WITH_CANARY
)
hashes = st.text(SAFE, min_size=1, max_size=10)  # a uint32 in the safe alphabet
suffixes = st.text(SAFE, min_size=SUFFIX, max_size=SUFFIX)


@settings(max_examples=500, deadline=None)
@given(service_names, st.sampled_from(TRACKS), hashes, suffixes)
def test_every_pod_of_a_track_is_told_as_that_track(service, track, template_hash, suffix):
    pod = pod_name(deployment_name(service, track), template_hash, suffix)
    assert track_of_pod(service, pod) == track


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=MAX_NAME_WITH_CANARY), hashes, suffixes)
def test_long_names_too(length, template_hash, suffix):
    """Names at every length up to the bound, so the cut falls everywhere in the hash."""
    service = "a" + "b" * (length - 1)
    for track in TRACKS:
        pod = pod_name(deployment_name(service, track), template_hash, suffix)
        assert track_of_pod(service, pod) == track
