"""Which PriorityClass an InferenceService may give its engines: only those the operator's
allowedPriorityClasses lists, never a system-* class, and always none."""

from __future__ import annotations

import argparse

import pytest

from inference_operator.config import SETTINGS, OperatorConfig
from inference_operator.spec import parse_spec
from infergrid.errors import ContractError
from infergrid.settings import add_flags, load_settings

MODEL = {"name": "m", "storageUri": "pkg://m"}
FIELD = "spec.scheduling.priorityClassName"


def parse(priority_class: str, allowed: tuple[str, ...] = ()) -> str:
    doc = {"model": MODEL, "resources": {"gpus": 1},
           "scheduling": {"priorityClassName": priority_class}}  # fmt: skip
    return parse_spec(doc, "img", "sched", allowed).scheduling.priority_class_name


def refusal(priority_class: str, allowed: tuple[str, ...] = ()) -> str:
    with pytest.raises(ContractError) as err:
        parse(priority_class, allowed)
    assert str(err.value).startswith(f"{FIELD}: ")
    return str(err.value)


def load(argv: list[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, SETTINGS)
    return load_settings(OperatorConfig(), SETTINGS, parser.parse_args(argv))


def test_a_listed_class_is_given_to_the_pods():
    assert parse("batch-high", ("batch-low", "batch-high")) == "batch-high"


def test_none_is_always_allowed():
    assert parse("", ()) == ""


def test_a_class_the_operator_does_not_list_is_refused_naming_what_is_allowed():
    message = refusal("batch-urgent", ("batch-low", "batch-high"))
    assert "'batch-urgent' is not in the operator's allowedPriorityClasses" in message
    assert "(batch-high, batch-low)" in message


def test_by_default_no_class_is_allowed():
    assert "allowedPriorityClasses (none)" in refusal("batch-high")


@pytest.mark.parametrize("system", ["system-cluster-critical", "system-node-critical"])
def test_system_classes_are_refused_even_where_listed(system):
    assert "system-* classes are reserved" in refusal(system, (system,))


def test_the_setting_defaults_to_none_and_reads_a_list_or_a_comma_separated_flag(tmp_path):
    assert load([]).allowed_priority_classes == ()
    path = tmp_path / "operator.yaml"
    path.write_text("version: v1\nallowedPriorityClasses: [batch-low, batch-high]\n")
    assert load(["--config", str(path)]).allowed_priority_classes == ("batch-low", "batch-high")
    flagged = load(["--allowed-priority-classes", "a, b"])
    assert flagged.allowed_priority_classes == ("a", "b")


def test_the_setting_refuses_a_system_class_at_start():
    with pytest.raises(ContractError, match="^allowedPriorityClasses: 'system-node-critical'"):
        load(["--allowed-priority-classes", "batch,system-node-critical"])
