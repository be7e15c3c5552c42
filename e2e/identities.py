"""The identities the e2e suite runs InferGrid's components with: the chart's own.

One release of the chart per test run gives every component its ServiceAccount, its RBAC and
its admission policies, exactly as `helm install` makes them. A test that runs a component
as a process beside the cluster (to kill it mid-stream, restart it with other flags, or read
its log) gives it that ServiceAccount's token, minted by TokenRequest, never the cluster
admin's credentials. The release's policies cover the namespaces labelled with
`Identities.policed`, which the `namespace` fixture carries. A device plugin run for a
KWOK node holds a token bound to the release's DaemonSet pod there, as a pod's would be.

The release installs with the KWOK values: its own Deployments' pods go to a CPU node only
some modules make (e2e/helm_release.py), so here they stay Pending, and nothing but their
identities is used. The chart's components running for real, in pods on the real node, are
e2e/test_helm.py's and e2e/test_preemption.py's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.helm_release import (
    CHART,
    E2E_LABEL,
    HELM,
    KWOK_VALUES,
    SCOPE_KEY,
    Release,
    as_token,
    device_plugin_pod,
    helm,
    ok,
    token,
    token_kubeconfig,
)


@dataclass(frozen=True)
class Identities:
    cluster: object
    release: Release

    @property
    def policed(self) -> dict[str, str]:
        """The label that puts a namespace under the release's admission policies."""
        return {E2E_LABEL: self.release.name}

    def kubeconfig(self, component: str, path: Path) -> Path:
        """A kubeconfig holding a fresh token of the component's ServiceAccount (one hour)."""
        return token_kubeconfig(self.cluster, self._token(component), path)

    def api(self, component: str) -> client.ApiClient:
        """An API client holding a fresh token of the component's ServiceAccount, for its code
        run inside the test (the extender's watch cache, its Lease elector)."""
        return as_token(self.cluster, self._token(component))

    def plugin_kubeconfig(self, node: str, path: Path) -> Path:
        """The device plugin's token bound to the release's DaemonSet pod on `node`, as the
        kubelet gives it: its admission policy lets it change only that node and its pods."""
        wait_until(lambda: device_plugin_pod(self.cluster, self.release, node), 60,
                   f"the chart's device plugin pod on {node}")  # fmt: skip
        pod = device_plugin_pod(self.cluster, self.release, node)
        return token_kubeconfig(self.cluster, self._token("device-plugin", pod), path)

    def _token(self, component: str, pod: client.V1Pod | None = None) -> str:
        return token(self.cluster, self.release.namespace, self.release.sa(component), pod)

    def lease_args(self) -> list[str]:
        """The extender's Lease as the chart names it: its RBAC may update that one only."""
        return ["--lease-namespace", self.release.namespace,
                "--lease-name", self.release.sa("extender")]  # fmt: skip


def install_suite_release(cluster) -> Identities:
    """The suite's release: operator and gateway rights cluster-wide (no watchNamespaces),
    since every test makes its own namespace; its policies only where `policed` is set."""
    if not HELM.exists():
        pytest.fail(f"helm is not built ({HELM}); run `make cluster-build`")
    name = f"suite{uuid.uuid4().hex[:5]}"
    namespace = f"infergrid-{name}"
    client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": namespace}})
    ok(helm(
        cluster, "install", name, str(CHART), "--namespace", namespace, "-f", str(KWOK_VALUES),
        "--set", f"admissionPolicy.namespaceSelector.matchLabels.{SCOPE_KEY}={name}",
    ))  # fmt: skip
    manifest = ok(helm(cluster, "get", "manifest", name, "--namespace", namespace))
    return Identities(cluster, Release(name, namespace, "", manifest))


def uninstall_suite_release(identities: Identities) -> None:
    release, cluster = identities.release, identities.cluster
    helm(cluster, "uninstall", release.name, "--namespace", release.namespace, "--wait")
    client.CoreV1Api(cluster.api).delete_namespace(release.namespace)
