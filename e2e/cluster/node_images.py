"""The images a real node runs, built here and loaded into its containerd."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def node_images() -> tuple[str, Callable[[Path], None]]:
    """The sandbox (pause) image's name, and how to load every image into a containerd."""
    return "docker.io/infergrid/pause:dev", lambda socket: None
