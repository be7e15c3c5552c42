"""Installing the repository's CRDs on a cluster: for the e2e suite and the demo."""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from e2e.cluster.processes import wait_until

CRDS = Path(__file__).resolve().parents[1] / "crds"


def install_crds(api: client.ApiClient) -> None:
    """Every CRD in `crds/` created (or replaced) and Established."""
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(CRDS.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise
            body["metadata"]["resourceVersion"] = ext.read_custom_resource_definition(
                name
            ).metadata.resource_version
            ext.replace_custom_resource_definition(name, body)

        def established(name: str = name) -> bool:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(established, 60, f"CRD {name} Established")
