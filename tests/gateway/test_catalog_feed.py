"""The watches' side of the catalog: nothing is published until every source has listed,
and each later event publishes the whole catalog again."""

from __future__ import annotations

from gateway.kube import CatalogFeed
from tests.gateway.test_catalog import endpoint, endpoint_slice, service


def sources(feed: CatalogFeed):
    feed._expected = 2  # what start() sets for one namespace: services and slices
    return feed._source("services", "ml", None, {}), feed._source("slices", "ml", None, {})


def test_the_first_catalog_waits_for_both_lists_then_events_update_it():
    published = []
    feed = CatalogFeed(published.append)
    services, slices = sources(feed)
    services.replace([service("chat", "m")], None)
    assert published == [] and not feed.synced
    slices.replace([], None)
    assert feed.synced and published[-1].routes["m"].backends == ()
    slices.apply("ADDED", endpoint_slice("chat", endpoint("chat-7d9f8b6c5-x2kzq", "10.0.0.5")))
    assert [b.pod for b in published[-1].routes["m"].backends] == ["chat-7d9f8b6c5-x2kzq"]
    services.apply("DELETED", service("chat", "m"))
    assert published[-1].routes == {}
