"""The images a real node runs: built here by `images.build` (cached by their inputs, so a
warm build costs seconds) and loaded into the node's containerd before its kubelet starts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from images import record
from images.build import build, images_home
from images.cluster_binaries import paths
from images.containerd_load import LoadError, load

from .processes import ClusterError

SANDBOX = "pause"
LOCAL_VALUES = Path(__file__).resolve().parents[2] / "deploy/helm/values/local-cluster.yaml"
"""The chart's values for the local cluster's real node: no pulls, every component there."""


def node_images() -> tuple[str, Callable[[Path], None]]:
    """Builds what is missing; returns the sandbox (pause) image's reference, and how to load
    every image into a containerd given its socket."""
    try:
        built = build()
    except SystemExit as err:  # the builder's own message names what is missing
        raise ClusterError(f"building the images failed: {err}") from None

    def load_into(socket: Path) -> None:
        try:
            load(address=socket, prune=True, ctr_binary=str(paths()["ctr"]))
        except LoadError as err:
            raise ClusterError(f"loading the images into containerd failed: {err}") from None

    return built[SANDBOX].reference, load_into


def image_ref(name: str) -> str:
    """The reference of a built image, as pods name it (docker.io/infergrid/<name>:<tag>)."""
    images = record.read(images_home() / record.RECORD)["images"]
    if name not in images:
        raise ClusterError(f"image {name} is not built: make images")
    return images[name]["reference"]


# Chart value -> the image whose tag it takes.
CHART_IMAGES = {
    "operator.image": "operator",
    "operator.engineImage": "engine",
    "operator.runtimeImages.llama\\.cpp": "llama-cpp",
    "scheduler.extender.image": "scheduler-extender",
    "scheduler.kubeScheduler.image": "kube-scheduler",
    "devicePlugin.image": "device-plugin",
    "gateway.image": "gateway",
}


def chart_args(values: Path, fleet: Path) -> list[str]:
    """helm flags that install the chart on the real node with the images built here."""
    args = ["-f", str(values), "--set-file", f"devicePlugin.fakeFleet={fleet}"]
    for key, name in CHART_IMAGES.items():
        repository, tag = image_ref(name).removeprefix("docker.io/").rsplit(":", 1)
        args += ["--set", f"{key}.repository={repository}", "--set", f"{key}.tag={tag}"]
    return args
