"""Who may call a service's engines: the NetworkPolicy the operator renders for it, the token
Secret its engine pods read, the spec field and the settings that decide both."""

from __future__ import annotations

import argparse
import base64

import kopf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_operator import handlers
from inference_operator.config import SETTINGS, OperatorConfig
from inference_operator.engine_access import (
    NO_FENCES,
    Caller,
    EngineAccess,
    render_network_policy,
)
from inference_operator.render import render_children, render_deployment
from inference_operator.spec import parse_spec
from infergrid.engine_token import TOKEN_FILE_ENV, derive, with_key
from infergrid.errors import ContractError
from infergrid.settings import add_flags, load_settings
from tests.operator.test_handlers import RecordingKube, found

KEY = b"0123456789abcdef0123456789abcdef"
GATEWAY = Caller("infergrid", (("app.kubernetes.io/component", "gateway"),
                               ("app.kubernetes.io/instance", "ig")))  # fmt: skip
OPERATOR = Caller("infergrid", (("app.kubernetes.io/component", "operator"),))
FENCED = EngineAccess(True, (GATEWAY, OPERATOR), ("192.168.1.0/24",), KEY)
MODEL = {"name": "m", "storageUri": "pkg://m"}


def spec(**fields):
    doc = {"model": MODEL, "resources": {"gpus": 1}, **fields}
    return parse_spec(doc, "infergrid/engine:0.1.0", "infergrid-scheduler")


def by_kind(children: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for child in children:
        kinds.setdefault(child["kind"], []).append(child)
    return kinds


def test_the_policy_admits_the_engine_port_only_from_the_gateway_the_operator_and_cidrs():
    (policy,) = by_kind(render_children(spec(), "chat", "team-a", access=FENCED))["NetworkPolicy"]
    assert policy["metadata"] == {"name": "chat", "namespace": "team-a",
                                  "labels": policy["metadata"]["labels"]}  # fmt: skip
    assert policy["spec"]["podSelector"] == {"matchLabels": {"infergrid.io/inferenceservice":
                                                             "chat"}}  # fmt: skip
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "infergrid"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/component": "gateway",
                                         "app.kubernetes.io/instance": "ig"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "infergrid"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}}},
        {"ipBlock": {"cidr": "192.168.1.0/24"}},
    ]  # fmt: skip


def test_the_services_own_namespace_is_admitted_only_when_its_spec_says_so():
    def peers(s) -> list[dict]:
        (policy,) = by_kind(render_children(s, "chat", "team-a", access=FENCED))["NetworkPolicy"]
        return policy["spec"]["ingress"][0]["from"]

    assert {"podSelector": {}} not in peers(spec())
    assert {"podSelector": {}} in peers(spec(network={"allowSameNamespace": True}))


def test_with_no_peer_the_policy_admits_nothing_rather_than_everything():
    """An ingress rule without `from` admits every source; so no peer means no rule."""
    access = EngineAccess(network_policy=True)
    policy = render_network_policy("chat", "team-a", access, False, {})
    assert policy["spec"]["ingress"] == []


CALLERS = st.lists(
    st.builds(
        Caller, st.sampled_from(["infergrid", "monitoring"]), st.just((("app", "x"),))
    ),  # fmt: skip
    max_size=3,
)


@given(CALLERS, st.lists(st.sampled_from(["10.0.0.0/8", "::1/128"]), max_size=2), st.booleans())
def test_every_rule_names_its_sources_and_every_source_is_one_allowed(
    callers: list[Caller], cidrs: list[str], same: bool
) -> None:
    access = EngineAccess(True, tuple(callers), tuple(cidrs))
    policy = render_network_policy("chat", "team-a", access, same, {})
    allowed = len(callers) + len(cidrs) + same
    assert len(policy["spec"]["ingress"]) == (1 if allowed else 0)
    for rule in policy["spec"]["ingress"]:
        assert len(rule["from"]) == allowed
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_the_token_secret_holds_the_services_own_token():
    (secret,) = by_kind(render_children(spec(), "chat", "team-a", access=FENCED))["Secret"]
    assert secret["metadata"]["name"] == "chat-engine-token"
    assert secret["metadata"]["namespace"] == "team-a"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == derive(KEY, "team-a", "chat")
    assert token != derive(KEY, "team-b", "chat")


def test_engine_pods_read_the_token_from_the_secret_and_roll_when_it_changes():
    def template(key: bytes) -> dict:
        access = EngineAccess(token_key=key)
        return render_deployment(spec(), "chat", "team-a", access=access)["spec"]["template"]

    pod = template(KEY)["spec"]
    (engine,) = pod["containers"]
    assert {"name": "engine-token", "secret": {"secretName": "chat-engine-token",
                                               "defaultMode": 0o444}} in pod["volumes"]  # fmt: skip
    mount = {"name": "engine-token", "mountPath": "/var/run/infergrid/engine-token",
             "readOnly": True}  # fmt: skip
    assert mount in engine["volumeMounts"]
    env = {"name": TOKEN_FILE_ENV, "value": "/var/run/infergrid/engine-token/token"}
    assert env in engine["env"]
    digest = "infergrid.io/engine-token-sha256"
    assert (
        template(KEY)["metadata"]["annotations"][digest]
        != (template(KEY[::-1])["metadata"]["annotations"][digest])
    )


def test_without_fences_nothing_is_added():
    children = render_children(spec(), "chat", "team-a", access=NO_FENCES)
    assert "NetworkPolicy" not in by_kind(children) and "Secret" not in by_kind(children)
    (deployment,) = by_kind(children)["Deployment"]
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    assert TOKEN_FILE_ENV not in {e["name"] for e in engine["env"]}


def test_the_fences_come_before_any_pod_can_start():
    kinds = [c["kind"] for c in render_children(spec(), "chat", "team-a", access=FENCED)]
    assert kinds.index("Secret") < kinds.index("Deployment")
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")


@pytest.mark.parametrize(
    ("network", "field"),
    [({"allowSameNamespace": "yes"}, "spec.network.allowSameNamespace"),
     ({"allowAll": True}, "spec.network.allowAll"),
     ("open", "spec.network")],
)  # fmt: skip
def test_a_bad_network_field_is_refused_naming_it(network, field):
    with pytest.raises(ContractError) as err:
        spec(network=network)
    assert err.value.field == field


# The operator's settings, and the handlers applying what they render.


def load(argv: list[str]) -> OperatorConfig:
    parser = argparse.ArgumentParser()
    add_flags(parser, SETTINGS)
    return load_settings(OperatorConfig(), SETTINGS, parser.parse_args(argv))


def test_the_settings_from_the_file_and_the_flags(tmp_path):
    (tmp_path / "key").write_bytes(KEY + b"\n")
    path = tmp_path / "operator.yaml"
    path.write_text(
        "version: v1\nengineNetworkPolicy: true\n"
        "engineCallers: [{namespace: infergrid, podLabels: {app.kubernetes.io/component: "
        "operator}}]\n"
        f"engineIngressCidrs: [192.168.1.0/24]\nengineTokenKeyFile: {tmp_path / 'key'}\n"
    )
    cfg = with_key(load(["--config", str(path)]))
    assert cfg.engine_network_policy and cfg.engine_callers == (OPERATOR,)
    assert cfg.engine_ingress_cidrs == ("192.168.1.0/24",) and cfg.engine_token_key == KEY
    cfg = load(["--engine-callers", '[{"namespace": "infergrid", "podLabels": '
                '{"app.kubernetes.io/component": "operator"}}]',
                "--engine-ingress-cidrs", "10.0.0.0/8,::1/128"])  # fmt: skip
    assert cfg.engine_callers == (OPERATOR,)
    assert cfg.engine_ingress_cidrs == ("10.0.0.0/8", "::1/128")


@pytest.mark.parametrize(
    ("argv", "field"),
    [(["--engine-callers", "[{namespace: x}"], "engineCallers"),
     (["--engine-callers", '[{"namespace": "x"}]'], "engineCallers[0].podLabels"),
     (["--engine-callers", '[{"namespace": "x", "podLabels": {}}]'], "engineCallers[0].podLabels"),
     (["--engine-callers", '[{"namespace": "x", "podLabels": {"a b": "c"}}]'],
      "engineCallers[0].podLabels[a b]"),
     (["--engine-callers", '[{"namespace": "x", "pods": {}}]'], "engineCallers[0].pods"),
     (["--engine-ingress-cidrs", "10.0.0.1/8"], "engineIngressCidrs[0]")],
)  # fmt: skip
def test_a_bad_setting_is_refused_naming_it(argv, field):
    with pytest.raises(ContractError) as err:
        load(argv)
    assert err.value.field == field


def memo(**config) -> kopf.Memo:
    return kopf.Memo(
        config=OperatorConfig(**config), kube=RecordingKube(), applied={}, refused=set()
    )


def body(**fields) -> dict:
    return {
        "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1", "generation": 1},
        "spec": {"model": MODEL, "resources": {"gpus": 1}, **fields},
    }


def test_the_handlers_apply_the_fences_the_settings_ask_for():
    m = memo(engine_network_policy=True, engine_callers=(GATEWAY,), engine_token_key=KEY)
    owner = body()
    handlers.apply_children(m, owner, handlers._parse(m, owner))
    kinds = by_kind(m.kube.applied)
    assert kinds["NetworkPolicy"][0]["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert kinds["Secret"][0]["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_a_token_secret_name_taken_by_someone_else_is_a_conflict_and_nothing_is_written(
    monkeypatch,
):
    monkeypatch.setattr(kopf, "warn", lambda *a, **kw: None)
    m = memo(engine_token_key=KEY)
    owner = body()
    m.kube.objects[("Secret", "chat-engine-token")] = found("chat-engine-token", None)
    with pytest.raises(kopf.PermanentError):
        handlers._apply_or_report(m, owner, handlers._parse(m, owner))
    assert m.kube.applied == []
