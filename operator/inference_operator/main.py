"""`infergrid-operator`: serves InferenceService objects with kopf.

infergrid-operator [--config FILE] [--namespaces a,b] [--metrics-url-template URL]

One replica: kopf runs standalone (no peering), so run it as a Deployment of
one pod with the Recreate strategy. kopf serves the liveness probe on
--liveness-endpoint (default http://0.0.0.0:8080/healthz) and stops cleanly
on SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import sys

import kopf
from kubernetes import config

from infergrid.engine_token import with_key
from infergrid.errors import ContractError
from infergrid.process import configure_logging, kube_api
from infergrid.settings import add_flags, load_settings

from . import handlers  # noqa: F401 - importing it registers the handlers with kopf
from .config import SETTINGS, OperatorConfig
from .kube import Kube


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infergrid-operator", description=__doc__)
    add_flags(parser, SETTINGS)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # a line per liveness probe
    try:
        cfg = with_key(load_settings(OperatorConfig(), SETTINGS, args))
        api = kube_api()
    except (ContractError, OSError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kopf.run(
        standalone=True,
        clusterwide=not cfg.namespaces,
        namespaces=cfg.namespaces,
        liveness_endpoint=cfg.liveness_endpoint,
        memo=kopf.Memo(config=cfg, kube=Kube(api), refreshes={}, applied={}, refused=set()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
