"""Pieces of the build CLI that decide without doing: the table and leftover mounts."""

from pathlib import Path

from images import build, record

MOUNTINFO = """22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
301 22 254:0 /cache/wheels /c/images/work/bundle-x/b/rootfs/wheels ro - ext4 /dev/vda rw
302 22 0:5 / /c/images/work/mm\\040dir/proc rw - proc proc rw
303 22 0:6 / /c/images/workshop rw - tmpfs tmpfs rw
"""


def test_mount_points_under_the_scratch_folder_deepest_first():
    assert build.mount_points_under(MOUNTINFO, Path("/c/images/work")) == [
        "/c/images/work/bundle-x/b/rootfs/wheels",
        "/c/images/work/mm dir/proc",
    ]


def image(name, seconds):
    tag = "0123456789ab"
    reference = f"docker.io/infergrid/{name}:{tag}"
    return record.BuiltImage(name, reference, tag, "sha256:" + "a" * 64, 5 << 30, name, seconds)


def test_table_has_a_row_per_image():
    lines = record.table([image("engine", 312.44), image("pause", 0)]).splitlines()
    assert lines[0].split() == ["image", "tag", "manifest", "digest", "size", "build", "s"]
    assert lines[1].split() == ["engine", "0123456789ab", "sha256:" + "a" * 64, "5.0", "GiB",
                                "312.4"]  # fmt: skip
    assert lines[2].split()[-1] == "cached"


def test_record_keeps_images_not_rebuilt(tmp_path):
    path = tmp_path / "images.json"
    record.update(path, tmp_path / "oci", {"engine": image("engine", 1)})
    record.update(path, tmp_path / "oci", {"pause": image("pause", 1)})
    saved = record.read(path)
    assert set(saved["images"]) == {"engine", "pause"}
    assert saved["images"]["engine"]["digest"] == "sha256:" + "a" * 64
    assert saved["layout"] == str(tmp_path / "oci")
