"""What every long-running part does the same way at start: logging and API credentials."""

from __future__ import annotations

import logging

from kubernetes import client, config

LOG_FORMAT = (
    '{"time":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","message":"%(message)s"}'
)


def configure_logging(level: str) -> None:
    """One JSON object per line, so log collectors need no parser of their own."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def kube_api() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    try:
        config.load_incluster_config()
        return client.ApiClient()
    except config.ConfigException:
        return config.new_client_from_config()
