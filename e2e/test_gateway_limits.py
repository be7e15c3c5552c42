"""The gateway's limits on the real node, as the chart installs it: a tenant's bucket of model
tokens pays what its streams really cost, and a body over the limit, or too costly to parse,
never reaches an engine.

The gateway runs from the image built here with its own ServiceAccount (a gateway-only
release, `install_gateway`), in front of one SmolLM2 engine pod that the operator, beside
the test with the chart's operator token, runs on the real node. Clients reach the gateway
through `kubectl port-forward` of its Service, with keys of the Secret the test writes as
the gateway's user would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import aiohttp
import openai
import pytest
import yaml
from kubernetes import client

from e2e.gateway_support import (
    KEYS,
    chat_service,
    engine_metrics,
    engine_pods,
    install_gateway,
    wait_ready_pods,
)
from e2e.helm_release import helm
from e2e.operator_support import kubectl
from e2e.real_pods import port_forward, serving_namespace
from harness.engine_process import requests_seen

pytestmark = pytest.mark.e2e

LIMITED, HOSTILE = "sk-team-limited-0001", "sk-team-hostile-0001"
TOKENS_PER_MINUTE = 150  # 2.5 a second
MAX_BODY = 65536
# Reserved: the prompt's bound (64 + 8 a message + its UTF-8 bytes: 89) plus max_tokens 60,
# 149 of the bucket's 150. Charged: what the engine reports, some 35 prompt tokens (SmolLM2's
# template adds a system prompt) plus the 60 generated (ignore_eos), which leaves the bucket
# 55 short of the next reservation until some 37 s of refill have passed. Charged 1 token,
# or the old estimate of 70 and never settled, it would have held enough.
QUESTION = [{"role": "user", "content": "Count to ten."}]


class Limited:
    def __init__(self, namespace: str, url: str) -> None:
        self.namespace, self.url = namespace, url


def tenants() -> str:
    return yaml.safe_dump({"version": "v1", "tenants": [
        {"name": "team-limited", "keys": [LIMITED], "tokensPerMinute": TOKENS_PER_MINUTE},
        {"name": "team-hostile", "keys": [HOSTILE]},
    ]})  # fmt: skip


@pytest.fixture(scope="module")
def limited(
    cluster, identities, infsvc_crd, extender, helm_ready, tmp_path_factory
) -> Iterator[Limited]:
    """A namespace with its keys Secret, a chart gateway limited to MAX_BODY bytes a body,
    the operator, and one SmolLM2 pod."""
    if not cluster.local:
        pytest.skip("serves on the local cluster's real node")
    core = client.CoreV1Api(cluster.api)
    log = tmp_path_factory.mktemp("gateway-limits") / "operator.log"
    namespace = f"limits-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    secret = {"metadata": {"name": KEYS}, "stringData": {"tenants.yaml": tenants()}}
    core.create_namespaced_secret(namespace, secret)
    try:
        release, metrics_url = install_gateway(
            cluster, namespace, values=(f"gateway.maxBodyBytes={MAX_BODY}",)
        )
    except BaseException:
        core.delete_namespace(namespace)
        raise
    operator_args = ("--gateway-metrics-url", metrics_url)
    with serving_namespace(cluster.api, identities, "", log, namespace=namespace,
                           operator_args=operator_args):  # fmt: skip
        try:
            service = chat_service()
            service["spec"]["replicas"] = 1
            kubectl(cluster.kubeconfig, "apply", "-n", namespace, "-f", "-",
                    stdin=yaml.safe_dump(service))  # fmt: skip
            wait_ready_pods(core, namespace, "smollm2", 1)
            gateway = f"svc/{release}-infergrid-gateway"
            with port_forward(cluster.kubeconfig, namespace, gateway, 80) as url:
                yield Limited(namespace, url)
        finally:
            helm(cluster, "uninstall", release, "--namespace", namespace, "--wait")


def reached(core: client.CoreV1Api, namespace: str) -> float:
    """Requests the engines received, however they ended, from their own /metrics."""
    return sum(requests_seen(engine_metrics(p)) for p in engine_pods(core, namespace, "smollm2"))


def test_a_stream_is_charged_its_real_usage_so_the_next_request_waits_for_the_bucket(limited):
    ai = openai.OpenAI(base_url=f"{limited.url}/v1", api_key=LIMITED, timeout=300, max_retries=0)
    asked = {"model": "smollm2", "messages": QUESTION, "max_tokens": 60, "temperature": 0,
             "extra_body": {"ignore_eos": True}}  # fmt: skip
    chunks = list(ai.chat.completions.create(**asked, stream=True))
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 30
    assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for
    with pytest.raises(openai.RateLimitError) as refused:
        ai.chat.completions.create(**asked)
    assert refused.value.code == "tokens_limit"
    assert "team-limited is over its tokens limit" in refused.value.message
    assert int(refused.value.response.headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b'{"model": "smollm2", "messages": [], "x": "' + b"a" * MAX_BODY + b'"}', 413,
         f"over the {MAX_BODY}-byte limit"),
        (b"[" * (MAX_BODY - 1024), 400, "not valid JSON"),  # nested past any parser's depth
    ],
)  # fmt: skip
def test_a_hostile_body_is_refused_naming_the_body_and_no_engine_sees_it(
    cluster, limited, body, status, says
):
    core = client.CoreV1Api(cluster.api)
    before = reached(core, limited.namespace)

    async def send() -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {HOSTILE}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{limited.url}/v1/chat/completions", data=body,
                                 headers=headers) as resp:  # fmt: skip
                return resp.status, await resp.json()

    got, doc = asyncio.run(send())
    assert (got, doc["error"]["param"]) == (status, "body")
    assert says in doc["error"]["message"]
    assert reached(core, limited.namespace) == before
