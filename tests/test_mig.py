"""MIG profiles per GPU family: what one instance of a profile gets."""

import pytest

from infergrid.errors import ContractError
from infergrid.mig import MIG_FAMILIES, MIG_SLICES, find_family, mig_profile


@pytest.mark.parametrize(
    ("model", "memory_mib", "family"),
    [
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H200", 143771, "H200-141GB"),
    ],
)
def test_gpus_are_matched_to_their_family_by_product_and_memory(model, memory_mib, family):
    found = find_family(model, memory_mib)
    assert found is not None and found.name == family


@pytest.mark.parametrize(
    ("model", "memory_mib"),
    [
        ("NVIDIA L4", 23034),
        ("NVIDIA RTX A1000", 8192),
        ("NVIDIA GH200 480GB", 97871),
        ("NVIDIA H100 NVL", 95830),
    ],
)
def test_gpus_outside_the_table_have_no_family(model, memory_mib):
    assert find_family(model, memory_mib) is None


@pytest.mark.parametrize(
    ("profile", "memory_mib"),
    [
        ("1g.10gb", 9728),
        ("2g.20gb", 19968),
        ("3g.40gb", 40192),
        ("4g.40gb", 40192),
        ("7g.80gb", 80384),
    ],
)
def test_a100_80gb_profiles_match_nvidia_sizes(profile, memory_mib):
    assert mig_profile("NVIDIA A100-SXM4-80GB", 81920, profile, "x").memory_mib == memory_mib


def test_an_instance_gets_its_share_of_the_sms_by_compute_slices():
    profile = mig_profile("NVIDIA A100-SXM4-80GB", 81920, "3g.40gb", "x")
    assert profile.slices == 3
    assert profile.sm_count(108) == 108 * 3 // 7


@pytest.mark.parametrize("family", MIG_FAMILIES, ids=lambda f: f.name)
def test_every_profile_fits_its_gpu(family):
    for name, memory_mib in family.profiles.items():
        profile = mig_profile(family.product, family.memory_mib, name, "x")
        assert 1 <= profile.slices <= MIG_SLICES
        assert memory_mib <= family.memory_mib


def test_unknown_profiles_and_gpus_name_the_field():
    with pytest.raises(ContractError, match="not a MIG profile of A100-80GB") as raised:
        mig_profile("NVIDIA A100-SXM4-80GB", 81920, "1g.5gb", "nodes[0].mig[0][1]")
    assert raised.value.field == "nodes[0].mig[0][1]"
    with pytest.raises(ContractError, match="no known MIG profiles") as raised:
        mig_profile("NVIDIA L4", 23034, "1g.5gb", "nodes[1].mig[0][0]")
    assert raised.value.field == "nodes[1].mig[0][0]"
