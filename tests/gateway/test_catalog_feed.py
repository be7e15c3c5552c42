"""The watches' side of the catalog: nothing is published until every source has listed
(InferenceServices, EndpointSlices and engine pods), each later event publishes the whole
catalog again, and a refused slice is logged once."""

from __future__ import annotations

import logging

from gateway.kube import CatalogFeed
from infergrid.constants import LABEL_INFERENCESERVICE
from tests.gateway.test_catalog import endpoint, endpoint_slice, service

POD = "chat-7d9f8b6c5-x2kzq"


def sources(feed: CatalogFeed):
    feed._expected = 3  # what start() sets for one namespace: services, slices and pods
    return tuple(feed._source(kind, "ml", None, {}) for kind in ("services", "slices", "pods"))


def engine_pod(name=POD, ip="10.0.0.5", **meta):
    """A pod as the API server sends it, with more than the gateway keeps."""
    return {
        "metadata": {"name": name, "namespace": "ml",
                     "labels": {LABEL_INFERENCESERVICE: "chat"}, **meta},
        "spec": {"containers": [{"name": "engine", "image": "infergrid/engine"}]},
        "status": {"podIP": ip, "podIPs": [{"ip": ip}]},
    }  # fmt: skip


def test_the_first_catalog_waits_for_every_list_then_events_update_it():
    published = []
    feed = CatalogFeed(published.append)
    services, slices, pods = sources(feed)
    services.replace([service("chat", "m")], None)
    slices.replace([], None)
    assert published == [] and not feed.synced, "the pods are not listed yet"
    pods.replace([engine_pod()], None)
    assert feed.synced and published[-1].routes["ml", "m"].backends == ()
    slices.apply("ADDED", endpoint_slice("chat", endpoint(POD, "10.0.0.5")))
    assert [b.pod for b in published[-1].routes["ml", "m"].backends] == [POD]
    services.apply("DELETED", service("chat", "m"))
    assert published[-1].routes == {}


def test_a_pod_leaving_takes_its_backend_with_it_before_its_slice_says_so():
    published = []
    feed = CatalogFeed(published.append)
    services, slices, pods = sources(feed)
    services.replace([service("chat", "m")], None)
    slices.replace([endpoint_slice("chat", endpoint(POD, "10.0.0.5"))], None)
    pods.replace([engine_pod()], None)
    assert [b.pod for b in published[-1].routes["ml", "m"].backends] == [POD]
    pods.apply("MODIFIED", engine_pod(deletionTimestamp="2026-01-01T00:00:00Z"))
    assert published[-1].routes["ml", "m"].backends == ()
    pods.apply("DELETED", engine_pod())
    assert published[-1].routes["ml", "m"].backends == ()


def test_a_forged_slice_is_logged_once_while_it_stays_and_again_if_it_comes_back(caplog):
    published = []
    feed = CatalogFeed(published.append)
    services, slices, pods = sources(feed)
    forged = endpoint_slice("chat", endpoint(POD, "169.254.169.254"))
    services.replace([service("chat", "m")], None)
    pods.replace([engine_pod()], None)
    with caplog.at_level(logging.WARNING, logger="infergrid.gateway.kube"):
        slices.replace([forged], None)
        services.apply("MODIFIED", service("chat", "m", replicas=2))
        slices.apply("DELETED", forged)
        slices.apply("ADDED", forged)
    warned = [r.getMessage() for r in caplog.records if "EndpointSlice" in r.getMessage()]
    assert (
        warned
        == [
            "EndpointSlice ml/chat-abcde is not routed to: endpoint chat-7d9f8b6c5-x2kzq has "
            "address ['169.254.169.254'], not the pod's IP"
        ]
        * 2
    )
    assert published[-1].routes["ml", "m"].backends == ()
