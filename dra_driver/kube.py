"""The API server edge: claims, this node's ResourceSlices and the Node, as plain JSON dicts.

Responses are read raw (``_preload_content=False``): the client's models would drop fields
they do not know, and the publisher must see exactly what the API server kept of a slice.
"""

from __future__ import annotations

import json
from typing import Any, Final

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_driver.claims import ApiError
from infergrid import dra

API_TIMEOUT_S: Final = 10
NOT_FOUND: Final = 404


def _json(response: Any) -> dict:
    return json.loads(response.data)


def _failure(what: str, err: ApiException) -> ApiError:
    return ApiError(f"{what}: {err.status} {err.reason}")


class KubeApi:
    """The calls the driver makes, each one verb of its RBAC: resourceclaims get; resourceslices
    list, create, update, delete; nodes get."""

    def __init__(self, api: client.ApiClient) -> None:
        self.resource = client.ResourceV1Api(api)
        self.core = client.CoreV1Api(api)

    def read_claim(self, namespace: str, name: str) -> dict | None:
        try:
            return _json(
                self.resource.read_namespaced_resource_claim(
                    name, namespace, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
            )
        except ApiException as err:
            if err.status == NOT_FOUND:
                return None
            raise _failure(f"get resourceclaim {namespace}/{name}", err) from None

    def read_node(self, name: str) -> dict:
        try:
            return _json(
                self.core.read_node(name, _preload_content=False, _request_timeout=API_TIMEOUT_S)
            )
        except ApiException as err:
            raise _failure(f"get node {name}", err) from None

    def list_slices(self, node: str) -> list[dict]:
        """This driver's slices of ``node``."""
        selector = f"spec.driver={dra.DRIVER},spec.nodeName={node}"
        try:
            return _json(
                self.resource.list_resource_slice(
                    field_selector=selector, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
            )["items"]
        except ApiException as err:
            raise _failure("list resourceslices", err) from None

    def create_slice(self, body: dict) -> dict:
        try:
            return _json(
                self.resource.create_resource_slice(
                    body, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
            )
        except ApiException as err:
            raise _failure(f"create resourceslice {body['metadata']['name']}", err) from None

    def replace_slice(self, body: dict) -> dict:
        """Updates the slice; ``body`` carries the resourceVersion it replaces."""
        name = body["metadata"]["name"]
        try:
            return _json(
                self.resource.replace_resource_slice(
                    name, body, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
            )
        except ApiException as err:
            raise _failure(f"update resourceslice {name}", err) from None

    def delete_slice(self, name: str) -> None:
        try:
            self.resource.delete_resource_slice(name, _request_timeout=API_TIMEOUT_S)
        except ApiException as err:
            if err.status != NOT_FOUND:
                raise _failure(f"delete resourceslice {name}", err) from None
