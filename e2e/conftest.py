"""Session fixtures: one cluster and one install of the chart for the whole e2e run.

By default the suite starts the local cluster (or reuses one that `make
cluster-up` left running, and then leaves it running). With
`INFERGRID_E2E_CLUSTER=existing` it uses the cluster that `KUBECONFIG` names
instead, and starts nothing: the tests read what they need from the API.

The components a test runs beside the cluster hold their chart ServiceAccount's token
(e2e/identities.py); the admin kubeconfig is for what an admin does. e2e/README.md says
which fixture runs what, with which identity.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from e2e.cluster import model_store
from e2e.cluster.local_cluster import LocalCluster
from e2e.cluster.processes import wait_until
from e2e.crds import install_crds
from e2e.helm_release import cpu_node, helm_ready, make_priority_classes, namespaces, release  # noqa: F401 - fixtures
from e2e.identities import Identities, install_suite_release, uninstall_suite_release
from e2e.operator_support import NO_METRICS, OperatorProcess, delete_every_service

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Cluster:
    api: client.ApiClient
    kubeconfig: Path
    local: bool


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    mode = os.environ.get("INFERGRID_E2E_CLUSTER", "local")
    if mode == "existing":
        path = Path(os.environ.get("KUBECONFIG", Path.home() / ".kube" / "config"))
        yield Cluster(config.new_client_from_config(str(path)), path, local=False)
        return
    if mode != "local":
        raise pytest.UsageError(f"INFERGRID_E2E_CLUSTER must be local or existing, not {mode!r}")
    local = LocalCluster()
    reused = local.is_running()
    if not reused:
        local.up()
    try:
        yield Cluster(local.api(), local.kubeconfig, local=True)
    finally:
        if not reused:
            local.down()
            # The real node changed machine-wide state; down must have put all of it back.
            assert local.leftovers == [], "make cluster-down left: " + "; ".join(local.leftovers)


@pytest.fixture(scope="session")
def identities(cluster: Cluster, infsvc_crd, priority_classes) -> Iterator[Identities]:
    """One install of the chart for the run, whose ServiceAccounts the components run as."""
    installed = install_suite_release(cluster)
    try:
        yield installed
    finally:
        uninstall_suite_release(installed)


UNPOLICED = "unpoliced"
"""The marker of a module whose namespaces the chart's admission policies leave alone; its
argument says why (e2e/README.md lists them)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{UNPOLICED}(why): the chart's admission policies skip this module's namespaces"
    )


@pytest.fixture()
def namespace(request, cluster: Cluster, identities: Identities) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards; under the suite release's admission
    policies unless the module is marked `unpoliced`."""
    core = client.CoreV1Api(cluster.api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    policed = request.node.get_closest_marker(UNPOLICED) is None
    labels = identities.policed if policed else {}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    wait_until(
        lambda: core.read_namespaced_service_account("default", name),
        60,
        f"the default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture(scope="module")
def extender(cluster: Cluster, identities: Identities, tmp_path_factory):
    """The scheduler extender at the URL the local infergrid-scheduler calls, as the chart's
    extender ServiceAccount (a process, so tests can kill and restart it)."""
    from e2e.cluster.local_cluster import LocalCluster
    from e2e.extender_support import ExtenderProcess

    if not cluster.local:
        pytest.skip("needs the local cluster's infergrid-scheduler pointed at this extender")
    home = tmp_path_factory.mktemp("extender")
    kubeconfig = identities.kubeconfig("extender", home / "kubeconfig")
    process = ExtenderProcess(
        LocalCluster().extender_url(), kubeconfig, home / "extender.log", identities.lease_args()
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def priority_classes(cluster: Cluster) -> None:
    """The chart's PriorityClasses, made once for the whole run (see make_priority_classes)."""
    make_priority_classes(cluster.api)


@pytest.fixture(scope="session")
def infsvc_crd(cluster: Cluster) -> None:
    """Every CRD in `crds/` installed (created or replaced) and Established."""
    install_crds(cluster.api)


@pytest.fixture()
def start_operator(cluster, identities, namespace, infsvc_crd, extender, tmp_path):
    """Starts operators on the test's namespace, as the chart's operator ServiceAccount; at the
    end deletes its services first.

    A service with autoscaling carries kopf's finalizer, which only a running
    operator removes; left behind, it would hold the namespace in Terminating.
    The namespace has the model store's claim, which the pvc:// samples name (their
    pods, on KWOK, never mount it, but the scheduler binds it).
    """
    started: list[OperatorProcess] = []
    model_store.provide(cluster.api, namespace, None)

    def start(*args: str) -> OperatorProcess:
        log = tmp_path / f"operator-{len(started)}.log"
        kubeconfig = identities.kubeconfig("operator", tmp_path / f"operator-{len(started)}.kc")
        process = OperatorProcess(kubeconfig, [namespace], log, *(args or NO_METRICS))
        process.start()
        started.append(process)
        return process

    yield start
    delete_every_service(cluster.api, namespace)
    for process in started:
        process.stop()
    model_store.withdraw(cluster.api, namespace)
