"""MIG profiles each MIG-capable GPU family offers, and what one instance gets.

The fake NVML and the fleet file create MIG instances from this table, and node
labels use it to say whether a GPU can do MIG at all. Memory sizes follow
NVIDIA's MIG user guide; SMs are the GPU's share by compute slices, which is
close enough for placement and never more than the GPU has.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from infergrid.errors import ContractError

MIG_SLICES: Final = 7
"""Compute slices of one MIG-capable GPU; a profile's ``<g>g`` is its share of these."""

MIG_PROFILE_NAME: Final = re.compile(r"([1-7])g\.[0-9]+gb")

_MEMORY_TOLERANCE: Final = 20
"""A GPU matches a family when its memory is within 1/20 (5%) of the family's."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU family, e.g. ``3g.40gb`` on an A100 80GB."""

    name: str
    memory_mib: int

    @property
    def slices(self) -> int:
        """Compute slices of the 7 a GPU has, read from the name (``3g.40gb`` → 3)."""
        return int(self.name.split("g.", 1)[0])

    def sm_count(self, gpu_sm_count: int) -> int:
        """SMs one instance gets on a GPU with ``gpu_sm_count`` SMs."""
        return gpu_sm_count * self.slices // MIG_SLICES


@dataclass(frozen=True, slots=True)
class MigFamily:
    """GPUs that share one MIG profile table: a product and its memory size."""

    name: str
    product: str
    memory_mib: int
    profiles: Mapping[str, int]

    def matches(self, model: str, memory_mib: int) -> bool:
        """Whether a GPU reported as ``model`` with ``memory_mib`` belongs to this family."""
        named = re.search(rf"(?<![A-Za-z0-9]){self.product}(?![0-9])", model) is not None
        return named and abs(memory_mib - self.memory_mib) <= self.memory_mib // _MEMORY_TOLERANCE


MIG_FAMILIES: Final = (
    MigFamily(
        "A100-40GB",
        "A100",
        40960,
        {
            "1g.5gb": 4864,
            "1g.10gb": 9856,
            "2g.10gb": 9856,
            "3g.20gb": 20096,
            "4g.20gb": 20096,
            "7g.40gb": 40448,
        },
    ),
    MigFamily(
        "A100-80GB",
        "A100",
        81920,
        {
            "1g.10gb": 9728,
            "1g.20gb": 19968,
            "2g.20gb": 19968,
            "3g.40gb": 40192,
            "4g.40gb": 40192,
            "7g.80gb": 80384,
        },
    ),
    MigFamily(
        "H100-80GB",
        "H100",
        81559,
        {
            "1g.10gb": 9984,
            "1g.20gb": 20096,
            "2g.20gb": 20096,
            "3g.40gb": 40448,
            "4g.40gb": 40448,
            "7g.80gb": 80896,
        },
    ),
    MigFamily(
        "H200-141GB",
        "H200",
        143771,
        {
            "1g.18gb": 16896,
            "1g.35gb": 33536,
            "2g.35gb": 33536,
            "3g.71gb": 67840,
            "4g.71gb": 67840,
            "7g.141gb": 135936,
        },
    ),
)


def find_family(model: str, memory_mib: int) -> MigFamily | None:
    """The MIG family of a GPU, or None when it cannot do MIG (or is not in the table)."""
    return next((f for f in MIG_FAMILIES if f.matches(model, memory_mib)), None)


def mig_profile(model: str, memory_mib: int, profile: str, path: str) -> MigProfile:
    """The profile named ``profile`` on a GPU; ``path`` names the field that asked for it."""
    family = find_family(model, memory_mib)
    if family is None:
        raise ContractError(path, f"{model} with {memory_mib} MiB has no known MIG profiles")
    if profile not in family.profiles:
        known = ", ".join(family.profiles)
        raise ContractError(path, f"{profile!r} is not a MIG profile of {family.name} ({known})")
    return MigProfile(profile, family.profiles[profile])
