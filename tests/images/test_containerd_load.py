"""The archive containerd imports names each image; what it has already is skipped."""

from images import containerd_load

DESC = {
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": "sha256:aa",
    "size": 10,
    "annotations": {"org.opencontainers.image.ref.name": "engine-0123"},
}
PLATFORM = {"architecture": "amd64", "os": "linux"}


def test_index_names_each_image_for_containerd():
    ref = "docker.io/infergrid/engine:0123456789ab"
    index = containerd_load.archive_index([(DESC, ref, PLATFORM)])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == ref
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "0123456789ab"
    assert entry["digest"] == "sha256:aa" and entry["size"] == 10
    assert entry["platform"] == PLATFORM
    assert index["schemaVersion"] == 2


CTR_LS = """REF                                 TYPE                                       DIGEST       SIZE     PLATFORMS   LABELS
docker.io/infergrid/engine:0123     application/vnd.oci.image.manifest.v1+json sha256:aa    5.0 GiB  linux/amd64 -
docker.io/infergrid/pause:4567      application/vnd.oci.image.manifest.v1+json sha256:bb    316 KiB  linux/amd64 io.cri-containerd.image=managed
"""  # noqa: E501


def test_parse_images():
    assert containerd_load.parse_images(CTR_LS) == {
        "docker.io/infergrid/engine:0123": "sha256:aa",
        "docker.io/infergrid/pause:4567": "sha256:bb",
    }
    assert containerd_load.parse_images("REF TYPE DIGEST SIZE PLATFORMS LABELS\n") == {}


def test_only_images_missing_or_different_are_imported():
    wanted = {
        "engine": {"reference": "docker.io/infergrid/engine:0123", "digest": "sha256:aa"},
        "pause": {"reference": "docker.io/infergrid/pause:4567", "digest": "sha256:cc"},
        "operator": {"reference": "docker.io/infergrid/operator:89ab", "digest": "sha256:dd"},
    }
    present = containerd_load.parse_images(CTR_LS)
    assert containerd_load.to_import(wanted, present) == ["pause", "operator"]


def test_images_of_earlier_builds_are_stale_and_other_repositories_are_left_alone():
    built = {
        "engine": {"reference": "docker.io/infergrid/engine:0123", "digest": "sha256:aa"},
        "pause": {"reference": "docker.io/infergrid/pause:4567", "digest": "sha256:bb"},
    }
    present = {
        "docker.io/infergrid/engine:0123": "sha256:aa",  # current
        "docker.io/infergrid/engine:old1": "sha256:a0",  # an earlier build
        "docker.io/infergrid/pause:4567": "sha256:b0",  # same tag, other content
        "registry.example/team/app:1": "sha256:ee",  # not ours
        "sha256:1d0": "sha256:aa",  # the kubelet's alias of the current engine
        "sha256:1d1": "sha256:a0",  # ... of the earlier engine
        "sha256:1d2": "sha256:ee",  # ... of the other repository's image
        "sha256:1d3": "sha256:99",  # ... of an image whose name was removed before
    }
    assert containerd_load.stale(built, present) == [
        "docker.io/infergrid/engine:old1",
        "docker.io/infergrid/pause:4567",
        "sha256:1d1",
        "sha256:1d3",
    ]
    assert containerd_load.stale(built, {}) == []
