"""Which GPU holders preemption may evict: the chart's offline class by default, the classes
the settings list, pods without a class only when asked, and never a system-* class."""

from __future__ import annotations

import pytest

from infergrid.errors import ContractError
from infergrid.placement.preemption import NO_CLASS
from tests.scheduler_extender.test_listeners import load


def test_by_default_only_the_offline_class_is_preemptible():
    assert load().preemptible() == frozenset({"infergrid-offline"})


def test_the_listed_classes_replace_the_default_and_pods_without_a_class_join_when_asked(
    tmp_path,
):
    config = tmp_path / "extender.yaml"
    config.write_text("version: v1\npreemptibleClasses: [batch, scavenger]\n")
    assert load(config=config).preemptible() == frozenset({"batch", "scavenger"})
    cfg = load("--preemptible-classes", "batch", "--preempt-pods-without-class")
    assert cfg.preemptible() == frozenset({"batch", NO_CLASS})
    assert load("--preemptible-classes", "").preemptible() == frozenset()  # nobody


@pytest.mark.parametrize("listed", ["system-node-critical", "batch,system-cluster-critical"])
def test_a_system_class_is_refused_naming_the_setting(listed, tmp_path):
    with pytest.raises(ContractError, match=r"^preemptibleClasses: 'system-.*never preempted"):
        load("--preemptible-classes", listed)
    config = tmp_path / "extender.yaml"
    config.write_text(f"version: v1\npreemptibleClasses: [{listed}]\n")
    with pytest.raises(ContractError, match=r"^preemptibleClasses: 'system-"):
        load(config=config)
