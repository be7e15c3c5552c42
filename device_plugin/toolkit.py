"""Whether this node's NVIDIA container toolkit lets a pod pick its GPUs by env var.

With `accept-nvidia-visible-devices-envvar-when-unprivileged` true, the toolkit's
default when the key is absent, the runtime gives any unprivileged container the
GPUs its own `NVIDIA_VISIBLE_DEVICES` names: past the extender, the kubelet and
this plugin, with only the gpu-env admission policy in the way, and only in the
namespaces it covers. The plugin cannot change the host's config, so it reads it
once at start and says what it found as a node condition, where an admin looks.

`toolkit_condition` decides, as a pure function of the file's text;
`read_toolkit_condition` is the edge that reads the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CONDITION_TOOLKIT_SAFE: Final = "InferGridContainerToolkitSafe"
"""The node condition: "True" when pods cannot pick GPUs by env var, "False" when they can."""
ENVVAR_KEY: Final = "accept-nvidia-visible-devices-envvar-when-unprivileged"
TOOLKIT_CONFIG: Final = "/etc/nvidia-container-runtime/config.toml"
"""Where the toolkit reads its config on most hosts; the GPU operator's is elsewhere."""


@dataclass(frozen=True, slots=True)
class NodeCondition:
    """A node condition as the API server stores it, less its times."""

    type: str
    status: str
    reason: str
    message: str


def _condition(status: str, reason: str, message: str) -> NodeCondition:
    return NodeCondition(CONDITION_TOOLKIT_SAFE, status, reason, message)


def toolkit_condition(text: str | None, path: str) -> NodeCondition:
    """The condition the toolkit config `text` read from `path` (None: no such file) earns.

    Only `false` is safe; a file that is missing or does not read is "Unknown",
    since the runtime may be reading another one.
    """
    if text is None:
        return _condition(
            "Unknown", "ConfigNotFound",
            f"{path} does not exist: whether unprivileged pods may pick GPUs with "
            "NVIDIA_VISIBLE_DEVICES is unknown (set devicePlugin.containerToolkitConfig "
            "to the config the node's NVIDIA runtime reads)",
        )  # fmt: skip
    try:
        value = tomllib.loads(text).get(ENVVAR_KEY, True)
    except tomllib.TOMLDecodeError as err:
        return _condition("Unknown", "ConfigUnreadable", f"{path} is not TOML: {err}")
    if not isinstance(value, bool):
        return _condition(
            "Unknown", "ConfigInvalid", f"{path}: {ENVVAR_KEY} is {value!r}, not true or false"
        )
    if value:
        return _condition(
            "False", "EnvvarAcceptedWhenUnprivileged",
            f"{path}: {ENVVAR_KEY} is not false, so any unprivileged pod gets the GPUs its "
            "NVIDIA_VISIBLE_DEVICES names, past the scheduler and the device plugin; set it "
            "to false (docs/security.md)",
        )  # fmt: skip
    return _condition(
        "True", "EnvvarIgnoredWhenUnprivileged",
        f"{path}: {ENVVAR_KEY} = false: a container sees only the GPUs the kubelet allocates",
    )  # fmt: skip


def read_toolkit_condition(path: Path) -> NodeCondition:
    """The condition of the config at `path`, as this node holds it now."""
    try:
        text: str | None = path.read_text()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as err:
        return _condition("Unknown", "ConfigUnreadable", f"{path} cannot be read: {err}")
    return toolkit_condition(text, str(path))
