"""The node condition that says whether the NVIDIA container toolkit lets pods pick GPUs.

`accept-nvidia-visible-devices-envvar-when-unprivileged` must be false: otherwise any
unprivileged pod gets the GPUs its own NVIDIA_VISIBLE_DEVICES names. The toolkit's
default, when the key is absent, is true.
"""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_plugin.kube import STRATEGIC_MERGE, set_node_condition
from device_plugin.toolkit import (
    CONDITION_TOOLKIT_SAFE,
    ENVVAR_KEY,
    NodeCondition,
    read_toolkit_condition,
    toolkit_condition,
)
from tests.device_plugin.test_kube import FakeCore, timed_out

PATH = "/etc/nvidia-container-runtime/config.toml"
NOW = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
CLI = '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n'


@pytest.mark.parametrize(
    ("text", "status", "reason"),
    [
        (f"{ENVVAR_KEY} = false\n{CLI}", "True", "EnvvarIgnoredWhenUnprivileged"),
        (f"{ENVVAR_KEY} = true\n{CLI}", "False", "EnvvarAcceptedWhenUnprivileged"),
        (CLI, "False", "EnvvarAcceptedWhenUnprivileged"),
        ("", "False", "EnvvarAcceptedWhenUnprivileged"),
        # Only the top-level key counts: the runtime reads no other.
        (f"[nvidia-container-cli]\n{ENVVAR_KEY} = false\n", "False",
         "EnvvarAcceptedWhenUnprivileged"),
        (f'{ENVVAR_KEY} = "false"\n', "Unknown", "ConfigInvalid"),
        (f"{ENVVAR_KEY} = 0\n", "Unknown", "ConfigInvalid"),
        (f"{ENVVAR_KEY} = \n", "Unknown", "ConfigUnreadable"),
        (None, "Unknown", "ConfigNotFound"),
    ],
    ids=["false", "true", "absent", "empty file", "in a section", "a string", "a number",
         "not TOML", "no file"],
)  # fmt: skip
def test_only_false_is_safe(text, status, reason):
    condition = toolkit_condition(text, PATH)
    assert (condition.type, condition.status, condition.reason) == (
        CONDITION_TOOLKIT_SAFE,
        status,
        reason,
    )
    assert condition.message.startswith(PATH)


def test_the_unsafe_message_says_what_a_pod_can_do_and_what_to_set():
    message = toolkit_condition("", PATH).message
    assert f"{ENVVAR_KEY} is not false" in message
    assert "NVIDIA_VISIBLE_DEVICES" in message and "set it to false" in message


values = st.one_of(st.booleans(), st.integers(), st.text(max_size=5), st.none())
"""A value of the key; None leaves it out."""


def rendered(value: object) -> str:
    """The value as TOML writes it; a string with odd characters may not be TOML at all."""
    return str(value).lower() if isinstance(value, bool) else '"' + str(value) + '"'


@given(values, st.dictionaries(st.sampled_from(["disable-require", "swarm-resource"]),
                               st.booleans()))  # fmt: skip
def test_the_condition_is_true_exactly_when_the_key_is_false(value, others):
    lines = [f"{k} = {rendered(v)}" for k, v in others.items()]
    if value is not None:
        lines.append(f"{ENVVAR_KEY} = {rendered(value)}")
    text = "\n".join(lines)
    try:
        read = tomllib.loads(text).get(ENVVAR_KEY, True)
    except tomllib.TOMLDecodeError:
        read = None
    wanted = "Unknown" if not isinstance(read, bool) else "False" if read else "True"
    assert toolkit_condition(text, PATH).status == wanted
    assert (wanted == "True") == (value is False)


def test_the_file_is_read_from_the_node(tmp_path):
    config = tmp_path / "config.toml"
    assert read_toolkit_condition(config).reason == "ConfigNotFound"
    config.write_text(f"{ENVVAR_KEY} = false\n")
    assert read_toolkit_condition(config).status == "True"
    assert read_toolkit_condition(tmp_path).reason == "ConfigUnreadable"


UNSAFE = NodeCondition(CONDITION_TOOLKIT_SAFE, "False", "EnvvarAcceptedWhenUnprivileged", "m")


def test_the_condition_is_merged_into_the_nodes_status_by_type():
    core = FakeCore()
    assert set_node_condition(core, "n", UNSAFE, NOW)
    ((what, _, node, body, content),) = core.sent
    assert (what, node, content) == ("node-status", "n", STRATEGIC_MERGE)
    assert body == {"status": {"conditions": [{
        "type": CONDITION_TOOLKIT_SAFE, "status": "False",
        "reason": "EnvvarAcceptedWhenUnprivileged", "message": "m",
        "lastHeartbeatTime": "2026-01-01T12:00:00Z", "lastTransitionTime": "2026-01-01T12:00:00Z",
    }]}}  # fmt: skip


def test_a_condition_the_api_server_does_not_take_is_only_reported():
    assert not set_node_condition(FakeCore(error=timed_out()), "n", UNSAFE, NOW)


def test_the_plugin_tells_the_condition_once_at_start(start_plugin, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f"{ENVVAR_KEY} = true\n")
    told: list[NodeCondition] = []
    p = start_plugin("l4-0", toolkit_config=str(config), node_condition=told.append)
    assert [(c.type, c.status) for c in told] == [(CONDITION_TOOLKIT_SAFE, "False")]
    assert p.runtime.node_condition is not None
