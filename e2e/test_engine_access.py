"""An engine pod answers only its gateway: a direct call skipping keys, namespace rules and
buckets is refused.

On the real node: the chart's gateway (a gateway-only release, which makes the engine token
key and mounts it), the operator beside the test on its chart ServiceAccount's token, given
the same key and told to fence engines, and one MiniLM InferenceService. This machine
reaches pod IPs as any pod would, so it plays the attacker calling the engine directly.

Two fences, tested apart. The engine token (infergrid/engine_token.py) is what refuses the
calls here: the local cluster's bridge network does not enforce NetworkPolicy, so the
operator's NetworkPolicy is checked as rendered and applied (its selectors, its owner) and by
a server-side dry-run create as the operator's own token, where a network plugin that
enforces it would take it from there.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from kubernetes import client

from e2e.gateway_support import (
    TEAM_B,
    engine_metrics,
    gateway_namespace,
    sample,
    wait_ready_pods,
)
from e2e.helm_release import helm
from e2e.operator_support import kubectl
from e2e.real_pods import port_forward, serving_namespace
from harness.engine_process import requests_seen
from infergrid.engine_token import HEADER, derive

pytestmark = pytest.mark.e2e

SERVICE = "minilm"
EMBED = json.dumps({"model": "minilm", "input": "who may call this engine?"}).encode()


@dataclass(frozen=True)
class Fenced:
    namespace: str
    release: str
    key: bytes
    gateway_url: str
    engine_ip: str


def gateway_caller(namespace: str, release: str) -> str:
    """The chart gateway's pods, as the operator's engineCallers setting names them."""
    labels = {"app.kubernetes.io/name": "infergrid", "app.kubernetes.io/instance": release,
              "app.kubernetes.io/component": "gateway"}  # fmt: skip
    return json.dumps([{"namespace": namespace, "podLabels": labels}])


@pytest.fixture(scope="module")
def fenced(
    cluster, identities, infsvc_crd, extender, helm_ready, tmp_path_factory
) -> Iterator[Fenced]:
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    tmp = tmp_path_factory.mktemp("engine-access")
    namespace, release, _ = gateway_namespace(cluster, "engine-access")
    secret = core.read_namespaced_secret(f"{release}-infergrid-engine-auth", namespace)
    key = base64.b64decode(secret.data["key"])
    key_file = tmp / "engine-auth-key"
    key_file.write_bytes(key)
    operator_args = ("--engine-token-key-file", str(key_file), "--engine-network-policy",
                     "--engine-callers", gateway_caller(namespace, release))  # fmt: skip
    with serving_namespace(cluster.api, identities, "", tmp / "operator.log",
                           namespace=namespace, operator_args=operator_args):  # fmt: skip
        try:
            body = sample("embeddings-canary.yaml")
            del body["spec"]["canary"]
            kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
                    stdin=yaml.safe_dump(body))  # fmt: skip
            (pod,) = wait_ready_pods(core, namespace, SERVICE, 1)
            service = f"svc/{release}-infergrid-gateway"
            with port_forward(cluster.kubeconfig, namespace, service, 80) as url:
                yield Fenced(namespace, release, key, url, pod.status.pod_ip)
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")


def post(url: str, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=EMBED, method="POST", headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def served(cluster, fenced: Fenced) -> float:
    """Requests the service's engine has seen, from its own (open) /metrics."""
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        fenced.namespace, label_selector=f"infergrid.io/inferenceservice={SERVICE}"
    )
    (pod,) = [p for p in pods.items if p.status.pod_ip == fenced.engine_ip]
    return requests_seen(engine_metrics(pod))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Bearer {TEAM_B}"},  # a client's own API key is not the token
        {HEADER: "0" * 64},
    ],
    ids=["no-token", "api-key", "made-up-token"],
)
def test_a_direct_call_to_the_engine_is_refused_and_the_engine_serves_nothing(
    cluster, fenced: Fenced, headers: dict[str, str]
) -> None:
    before = served(cluster, fenced)
    status, doc = post(f"http://{fenced.engine_ip}:8000/v1/embeddings", headers)
    assert status == 401
    assert doc["error"]["param"] == HEADER and HEADER in doc["error"]["message"]
    assert served(cluster, fenced) == before


def test_another_services_token_is_refused(cluster, fenced: Fenced) -> None:
    """What a tenant holds: the token of its own service in its own namespace."""
    before = served(cluster, fenced)
    for namespace, name in (("team-b", SERVICE), (fenced.namespace, "other")):
        status, _ = post(f"http://{fenced.engine_ip}:8000/v1/embeddings",
                         {HEADER: derive(fenced.key, namespace, name)})  # fmt: skip
        assert status == 401
    assert served(cluster, fenced) == before


def test_through_the_gateway_the_same_call_is_served(cluster, fenced: Fenced) -> None:
    before = served(cluster, fenced)
    key = {"Authorization": f"Bearer {TEAM_B}"}
    status, doc = post(f"{fenced.gateway_url}/v1/embeddings", key)
    assert status == 200, doc
    assert len(doc["data"][0]["embedding"]) == 384
    assert served(cluster, fenced) == before + 1


def test_the_token_secret_is_the_services_own(cluster, fenced: Fenced) -> None:
    secret = client.CoreV1Api(cluster.api).read_namespaced_secret(
        f"{SERVICE}-engine-token", fenced.namespace
    )
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("InferenceService", SERVICE, True)
    token = base64.b64decode(secret.data["token"]).decode()
    assert token == derive(fenced.key, fenced.namespace, SERVICE)


def test_the_network_policy_admits_only_the_gateway_and_the_operator_may_apply_it(
    cluster, identities, fenced: Fenced
) -> None:
    networking = client.NetworkingV1Api(cluster.api)
    policy = networking.read_namespaced_network_policy(SERVICE, fenced.namespace).to_dict()
    (owner,) = policy["metadata"]["owner_references"]
    assert (owner["kind"], owner["name"]) == ("InferenceService", SERVICE)
    spec = policy["spec"]
    assert spec["pod_selector"]["match_labels"] == {"infergrid.io/inferenceservice": SERVICE}
    assert spec["policy_types"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert [(p["port"], p["protocol"]) for p in rule["ports"]] == [("http", "TCP")]
    (peer,) = rule["_from"]
    assert peer["namespace_selector"]["match_labels"] == {
        "kubernetes.io/metadata.name": fenced.namespace
    }
    assert peer["pod_selector"]["match_labels"]["app.kubernetes.io/instance"] == fenced.release
    assert peer["pod_selector"]["match_labels"]["app.kubernetes.io/component"] == "gateway"
    # The same policy, created anew as the operator's own ServiceAccount: the API server
    # validates and authorizes it, and a dry run stores nothing.
    raw = networking.api_client.sanitize_for_serialization(
        networking.read_namespaced_network_policy(SERVICE, fenced.namespace)
    )
    body = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{SERVICE}-dry-run", "namespace": fenced.namespace},
            "spec": raw["spec"]}  # fmt: skip
    as_operator = client.NetworkingV1Api(identities.api("operator"))
    created = as_operator.create_namespaced_network_policy(fenced.namespace, body, dry_run="All")
    assert created.metadata.name == f"{SERVICE}-dry-run"
    names = [p.metadata.name for p in networking.list_namespaced_network_policy(
        fenced.namespace).items]  # fmt: skip
    assert f"{SERVICE}-dry-run" not in names


def test_the_gateway_pods_metrics_port_is_fenced_as_rendered(cluster, fenced: Fenced) -> None:
    """A gateway-only release runs no operator, and lists no Prometheus: no source may reach
    /metrics (port 9090, named by tenants), while the API port stays open to clients."""
    policy = client.NetworkingV1Api(cluster.api).read_namespaced_network_policy(
        f"{fenced.release}-infergrid-gateway", fenced.namespace
    )
    (api,) = policy.spec.ingress
    assert [p.port for p in api.ports] == ["http"]
    assert api._from is None  # every client: the API itself asks for a key
