"""Model names per caller: a caller is routed only inside the namespaces it may call, and a
bare name only where exactly one of them serves it."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from batching_engine.server.protocol import decode_json, parse_chat
from gateway.catalog import Catalog, Route
from gateway.model_names import Unresolved, as_served, names, qualified, resolve


def route(namespace: str, model: str, service: str = "svc") -> Route:
    return Route(model, namespace, service, canary_percent=0, replicas=1)


SQUATTED = Catalog.of(route("team-b", "chat"), route("team-a", "chat", "squat"),
                      route("team-a", "embed"))  # fmt: skip


def only(*namespaces: str):
    return lambda namespace: namespace in namespaces


def test_a_tenant_never_reaches_a_squatter_of_its_model_name():
    assert resolve(SQUATTED, "chat", only("team-b")).namespace == "team-b"
    assert resolve(SQUATTED, "team-b/chat", only("team-b")).namespace == "team-b"
    assert resolve(SQUATTED, "chat", only("team-a")).service == "squat"
    for name in ("team-b/chat", "team-a/embed"):
        with pytest.raises(Unresolved):
            resolve(SQUATTED, name, only("team-b" if name.startswith("team-a") else "team-a"))


def test_while_the_victims_service_is_re_created_its_name_is_unknown_not_the_squatters():
    gone = Catalog.of(route("team-a", "chat", "squat"))
    for name in ("chat", "team-b/chat"):
        with pytest.raises(Unresolved) as caught:
            resolve(gone, name, only("team-b"))
        assert not caught.value.ambiguous and caught.value.choices == ()


def test_a_bare_name_served_in_two_callable_namespaces_is_ambiguous_and_lists_both():
    with pytest.raises(Unresolved) as caught:
        resolve(SQUATTED, "chat", only("team-a", "team-b"))
    assert caught.value.ambiguous
    assert caught.value.choices == ("team-a/chat", "team-b/chat")
    assert resolve(SQUATTED, "team-b/chat", only("team-a", "team-b")).namespace == "team-b"


def test_an_unknown_name_lists_only_the_names_the_caller_may_use():
    with pytest.raises(Unresolved) as caught:
        resolve(SQUATTED, "gpt-5", only("team-a"))
    assert caught.value.choices == ("chat", "embed", "team-a/chat", "team-a/embed")


def test_the_listing_has_qualified_names_always_and_bare_ones_where_unambiguous():
    listed = names(SQUATTED, only("team-a", "team-b"))
    assert {n: (r.namespace, r.service) for n, r in listed.items()} == {
        "embed": ("team-a", "svc"),
        "team-a/chat": ("team-a", "squat"),
        "team-a/embed": ("team-a", "svc"),
        "team-b/chat": ("team-b", "svc"),
    }


def test_a_model_named_like_another_namespaces_qualified_name_never_takes_it_over():
    """team-a names its model `team-b/chat`: a caller of both namespaces reaches team-b's
    chat by that name, and nothing while team-b's is gone; team-a's own callers reach
    team-a's by it, since team-b is no namespace of theirs."""
    squat = route("team-a", "team-b/chat", "squat")
    both = only("team-a", "team-b")
    assert resolve(Catalog.of(squat, route("team-b", "chat")), "team-b/chat", both).namespace == (
        "team-b"
    )
    with pytest.raises(Unresolved):
        resolve(Catalog.of(squat), "team-b/chat", both)
    assert resolve(Catalog.of(squat), "team-a/team-b/chat", both) == squat
    assert resolve(Catalog.of(squat), "team-b/chat", only("team-a")) == squat


def test_an_org_slash_name_model_resolves_bare_where_org_is_no_namespace_of_the_caller():
    hf = route("ml", "HuggingFaceTB/SmolLM2-135M")
    assert resolve(Catalog.of(hf), "HuggingFaceTB/SmolLM2-135M", lambda _: True) == hf
    meta = route("ml", "meta-llama/Llama-3")
    assert resolve(Catalog.of(meta), "meta-llama/Llama-3", only("ml")) == meta
    assert resolve(Catalog.of(meta), "ml/meta-llama/Llama-3", lambda _: True) == meta


NAMESPACES = st.sampled_from(["team-a", "team-b", "team-c", "org"])
MODELS = st.sampled_from(["chat", "embed", "org/chat", "team-a/chat", "Org/x"])
CATALOGS = st.lists(st.tuples(NAMESPACES, MODELS), max_size=8).map(
    lambda pairs: Catalog.of(*(route(ns, m) for ns, m in pairs))
)
CALLERS = st.frozensets(NAMESPACES)


@given(catalog=CATALOGS, allowed=CALLERS, name=st.one_of(MODELS, st.builds(
    "{}/{}".format, NAMESPACES, MODELS), st.text(max_size=12)))  # fmt: skip
def test_a_caller_is_never_routed_outside_its_namespaces(catalog, allowed, name):
    try:
        found = resolve(catalog, name, allowed.__contains__)
    except Unresolved as err:  # and what it suggests instead is inside them too
        for choice in err.choices:
            assert resolve(catalog, choice, allowed.__contains__).namespace in allowed
        return
    assert found.namespace in allowed


@given(catalog=CATALOGS, allowed=CALLERS, model=st.sampled_from(["chat", "embed"]))
def test_a_bare_name_resolves_iff_exactly_one_allowed_namespace_serves_it(catalog, allowed, model):
    serving = {ns for (ns, m) in catalog.routes if m == model and ns in allowed}
    try:
        found = resolve(catalog, model, allowed.__contains__)
    except Unresolved as err:
        assert len(serving) != 1
        assert err.ambiguous == (len(serving) > 1)
        return
    assert serving == {found.namespace}


@given(catalog=CATALOGS, allowed=CALLERS)
def test_every_listed_name_resolves_to_its_route_and_every_route_is_listed_qualified(
    catalog, allowed
):
    listed = names(catalog, allowed.__contains__)
    for name, found in listed.items():
        assert resolve(catalog, name, allowed.__contains__) == found
    callable_routes = [r for r in catalog.routes.values() if r.namespace in allowed]
    assert {qualified(r) for r in callable_routes} <= listed.keys()


def test_the_engine_is_sent_the_model_name_it_serves():
    """A qualified name is replaced by the route's model; the engine's own parser reads the
    last of repeated members, and everything else goes byte for byte."""
    raw = b'{"model": "team-b/chat", "messages": [{"role": "user", "content": "hi"}]}\n'
    sent = as_served(raw, "team-b/chat", route("team-b", "chat"))
    assert sent.startswith(raw.rstrip()[:-1]) and orjson.loads(sent)["model"] == "chat"
    assert parse_chat(decode_json(sent)).model == "chat"
    assert as_served(raw, "chat", route("team-b", "chat")) is raw
