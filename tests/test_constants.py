"""The shared names parts agree on."""

from infergrid import constants


def test_mig_resource_is_the_nvidia_name_of_a_profile():
    assert constants.mig_resource("1g.10gb") == "nvidia.com/mig-1g.10gb"


def test_default_policy_is_one_of_the_policies():
    assert constants.DEFAULT_POLICY == "fgd-cluster-aware"
    assert set(constants.PLACEMENT_POLICIES) == {"binpack", "spread", "fgd", "fgd-cluster-aware"}


def test_link_types_run_from_closest_to_farthest():
    assert constants.LINK_TYPES == ("nvlink", "pcie-switch", "host-bridge", "numa", "system")
