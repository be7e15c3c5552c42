"""The machine-wide state a real node touches, read before `up` and put back by `down`.

A kubelet with containerd changes more than its own folders: sysctls, iptables chains,
mounts, network links, cgroups and a few well-known directories. `snapshot` reads all of
them as plain data; `iptables_undo` and `differences` are pure functions over two
snapshots, so what `down` undoes and what the tests check is the same comparison.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

# Every sysctl the kubelet or the CNI bridge may write (the kubelet's kernel tunables, and
# forwarding, which a bridge set up as a gateway turns on).
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)

# Directories outside the cluster's state folder that a kubelet and containerd create at fixed
# places whatever their settings say.
WELL_KNOWN_DIRS = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/var/run/netns",
    "/opt/containerd",
    "/etc/cni",
    "/run/infergrid",
    "/var/run/cdi",
)

CGROUP_ROOT = Path("/sys/fs/cgroup")
# Both backends: a kubelet writes through whichever its iptables binary picks.
IPTABLES = ("iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy")
# Built-in chains: a table that did not exist shows them too once something creates it, so
# an empty built-in chain with the default policy counts as absent.
BUILTIN_CHAINS = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")


@dataclass(frozen=True, slots=True)
class MachineState:
    """What a real node may change, as plain data (JSON-ready)."""

    sysctls: dict[str, str]
    iptables: dict[str, str]
    mounts: list[str]
    links: list[str]
    cgroups: list[str]
    dirs: list[str]


def snapshot() -> MachineState:
    return MachineState(
        sysctls={key: _read(Path("/proc/sys") / key) for key in SYSCTLS},
        iptables={tool: _iptables_save(tool) for tool in IPTABLES},
        mounts=sorted(_mount_points()),
        links=sorted(_links()),
        cgroups=sorted(_cgroups()),
        dirs=sorted(d for d in WELL_KNOWN_DIRS if Path(d).exists()),
    )


def save(state: MachineState, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=1))


def load(path: Path) -> MachineState | None:
    try:
        return MachineState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def differences(before: MachineState, after: MachineState) -> list[str]:
    """Each way `after` differs from `before`, one line each; empty when they agree."""
    found = [
        f"sysctl {key}: {before.sysctls.get(key)} then {value}"
        for key, value in after.sysctls.items()
        if before.sysctls.get(key) != value
    ]
    for tool in IPTABLES:
        for table, rule in _rule_set(after.iptables.get(tool, "")) - _rule_set(
            before.iptables.get(tool, "")
        ):
            found.append(f"{tool} -t {table}: {rule}")
    for kind in ("mounts", "links", "cgroups", "dirs"):
        added = set(getattr(after, kind)) - set(getattr(before, kind))
        found += [f"{kind[:-1]} left behind: {item}" for item in sorted(added)]
    return found


def iptables_undo(before: str, after: str) -> list[list[str]]:
    """The commands that take `after` (an iptables-save dump) back to `before`.

    Rules that were added are deleted first, then chains that were created are flushed and
    removed; nothing that was there before is touched.
    """
    rules_before, rules_after = _rule_set(before), _rule_set(after)
    chains_before, chains_after = _chains(before), _chains(after)
    commands = [
        ["-t", table, "-D", *rule.split()[1:]]
        for table, rule in sorted(rules_after - rules_before)
        if rule.startswith("-A ")
    ]
    for table, chain in sorted(chains_after - chains_before):
        commands.append(["-t", table, "-F", chain])
    for table, chain in sorted(chains_after - chains_before):
        commands.append(["-t", table, "-X", chain])
    return commands


def restore(before: MachineState) -> list[str]:
    """Puts back what changed since `before`, in the order that lets each step succeed:
    mounts (top-most first), links, cgroups (deepest first), directories, iptables, sysctls.
    Returns what still differs."""
    now = snapshot()
    for point in reversed([m for m in _mount_points() if m not in set(before.mounts)]):
        if subprocess.run(["umount", point], capture_output=True).returncode:
            subprocess.run(["umount", "-l", point], capture_output=True)
    for link in set(now.links) - set(before.links):
        subprocess.run(["ip", "link", "delete", link], capture_output=True)
    for group in set(now.cgroups) - set(before.cgroups):
        _remove_cgroup(CGROUP_ROOT / group)
    for directory in set(now.dirs) - set(before.dirs):
        shutil.rmtree(directory, ignore_errors=True)
    restore_iptables(before)
    restore_sysctls(before)
    return differences(before, snapshot())


def _remove_cgroup(group: Path) -> None:
    """rmdir from the leaves up; a group that still holds a process stays, and shows."""
    for child in sorted(group.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir():
            with contextlib.suppress(OSError):
                child.rmdir()
    with contextlib.suppress(OSError):
        group.rmdir()


def restore_iptables(before: MachineState) -> None:
    for tool in IPTABLES:
        for command in iptables_undo(before.iptables.get(tool, ""), _iptables_save(tool)):
            subprocess.run([tool, "-w", *command], capture_output=True, check=False)


def restore_sysctls(before: MachineState) -> None:
    for key, value in before.sysctls.items():
        path = Path("/proc/sys") / key
        if value and _read(path) != value:
            path.write_text(value)


def _rule_set(dump: str) -> set[tuple[str, str]]:
    """(table, rule) for every `-A` line and chain declaration, without packet counters."""
    rules, table = set(), ""
    for line in dump.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A "):
            rules.add((table, line))
        elif line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            if chain not in BUILTIN_CHAINS:
                rules.add((table, "chain " + chain))
            elif policy != "ACCEPT":
                rules.add((table, f"policy {chain} {policy}"))
    return rules


def _chains(dump: str) -> set[tuple[str, str]]:
    return {(t, rule.split()[1]) for t, rule in _rule_set(dump) if rule.startswith("chain ")}


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _iptables_save(tool: str) -> str:
    try:
        done = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return ""
    return done.stdout


def _mount_points() -> list[str]:
    """Mount points of this mount namespace (field 5 of mountinfo, octal escapes kept)."""
    return [line.split()[4] for line in _read(Path("/proc/self/mountinfo")).splitlines()]


def _links() -> list[str]:
    return [p.name for p in Path("/sys/class/net").iterdir()]


def _cgroups() -> list[str]:
    """Top-level groups of every v1 hierarchy; a kubelet adds `kubepods` to each."""
    if not CGROUP_ROOT.is_dir():
        return []
    return [
        f"{hierarchy.name}/{group.name}"
        for hierarchy in CGROUP_ROOT.iterdir()
        if hierarchy.is_dir()
        for group in hierarchy.iterdir()
        if group.is_dir()
    ]
