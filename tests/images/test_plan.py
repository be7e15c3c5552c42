"""Stage keys: a changed input changes its stage and those after it, nothing before."""

import re

import pytest

from images import components, plan

SOURCES = {
    "infergrid": "i0",
    "device_plugin": "d0",
    "dra_driver": "r0",
    "scheduler_extender": "s0",
    "inference_operator": "o0",
    "gateway": "g0",
    "batching_engine": "b0",
}
BINARIES = {"pause": "p0", "kube-scheduler": "k0", "llama-server": "l0"}
LOCKS = {"pip": "pip0", "deps": "deps0", "engine": "engine0", "model": "model0"}


def chains(pyproject, sources=SOURCES, binaries=BINARIES, locks=LOCKS):
    inputs = plan.Inputs(sources=dict(sources), binaries=dict(binaries), locks=dict(locks))
    return {n: plan.stages(i, inputs) for n, i in components.images(pyproject).items()}


def tags(pyproject, **kw):
    return {n: plan.image_tag(c) for n, c in chains(pyproject, **kw).items()}


def test_tags_are_stable_hex_and_distinct(pyproject):
    first, again = tags(pyproject), tags(pyproject)
    assert first == again
    assert all(re.fullmatch(r"[0-9a-f]{12}", t) for t in first.values())
    assert len(set(first.values())) == len(first)


def test_python_chain_shape(pyproject):
    engine = chains(pyproject)["engine"]
    assert [s.kind for s in engine] == ["debian", "pip", "pip", "pip-target", "app", "config"]
    operator = chains(pyproject)["operator"]
    assert [s.kind for s in operator] == ["debian", "pip", "app", "config"]


def test_components_share_their_base_and_dependency_layers(pyproject):
    c = chains(pyproject)
    for name in ("scheduler-extender", "operator", "gateway"):
        assert [s.key for s in c[name][:2]] == [s.key for s in c["device-plugin"][:2]]
    assert c["engine"][0].key != c["operator"][0].key  # another package list


def test_a_source_change_retags_only_the_images_that_carry_it(pyproject):
    before = chains(pyproject)
    after = chains(pyproject, sources={**SOURCES, "device_plugin": "d1"})
    changed = {n for n in before if plan.image_tag(before[n]) != plan.image_tag(after[n])}
    assert changed == {"device-plugin"}
    gateway = chains(pyproject, sources={**SOURCES, "gateway": "g1"})
    assert {n for n in before if plan.image_tag(before[n]) != plan.image_tag(gateway[n])} == {
        "gateway"
    }
    # the dependency layers stay: only the packages layer and the config are new
    assert [s.key for s in before["device-plugin"][:2]] == [
        s.key for s in after["device-plugin"][:2]
    ]
    shared = chains(pyproject, sources={**SOURCES, "infergrid": "i1"})
    assert {n for n in before if plan.image_tag(before[n]) != plan.image_tag(shared[n])} == {
        "device-plugin",
        "scheduler-extender",
        "operator",
        "gateway",
        "engine",
    }


def test_a_lock_change_rebuilds_from_its_group(pyproject):
    before = chains(pyproject)["engine"]
    after = chains(pyproject, locks={**LOCKS, "engine": "engine1"})["engine"]
    assert [s.key for s in before[:2]] == [s.key for s in after[:2]]  # base and deps kept
    assert all(b.key != a.key for b, a in zip(before[2:], after[2:], strict=True))
    assert (
        tags(pyproject, locks={**LOCKS, "engine": "engine1"})["operator"]
        == tags(pyproject)["operator"]
    )
    relocked_deps = tags(pyproject, locks={**LOCKS, "deps": "deps1"})
    assert {n for n, t in tags(pyproject).items() if relocked_deps[n] != t} == {
        "device-plugin",
        "scheduler-extender",
        "operator",
        "gateway",
        "engine",
    }


def test_a_pip_upgrade_rebuilds_every_dependency_layer(pyproject):
    before, after = tags(pyproject), tags(pyproject, locks={**LOCKS, "pip": "pip1"})
    assert {n for n in before if before[n] != after[n]} == {
        "device-plugin",
        "scheduler-extender",
        "operator",
        "gateway",
        "engine",
    }


def test_each_group_installs_its_own_lock(pyproject):
    engine = chains(pyproject)["engine"]
    deps, extra, model = (s.spec for s in engine[1:4])
    assert (deps.lock, extra.lock, model.lock) == ("deps0", "engine0", "model0")
    assert {deps.installer, extra.installer, model.installer} == {"pip0"}
    assert model.group.no_deps and model.group.requirements == components.MODEL_PACKAGES


def test_a_missing_lock_is_named(pyproject):
    with pytest.raises(KeyError, match="'engine'.*python -m images.lock"):
        chains(pyproject, locks={k: v for k, v in LOCKS.items() if k != "engine"})


def test_a_binary_change_retags_its_image(pyproject):
    before = tags(pyproject)
    after = tags(pyproject, binaries={**BINARIES, "pause": "p1"})
    assert {n for n in before if before[n] != after[n]} == {"pause"}


def test_missing_inputs_are_named(pyproject):
    with pytest.raises(KeyError, match="batching_engine"):
        chains(pyproject, sources={k: v for k, v in SOURCES.items() if k != "batching_engine"})


def test_reference_and_layout_tag():
    assert plan.reference("engine", "0123456789ab") == "docker.io/infergrid/engine:0123456789ab"
    assert plan.final_layout_tag("engine", "0123456789ab") == "engine-0123456789ab"
