"""A venv layer is what changed in the root: new and changed paths, whiteouts for the gone."""

import os
import tarfile

from images import layers, rootfs_diff


def make_root(tmp_path):
    root = tmp_path / "root"
    (root / "opt/venv/lib/old_pkg").mkdir(parents=True)
    (root / "opt/venv/lib/old_pkg/__init__.py").write_text("old\n")
    (root / "opt/venv/lib/keep.py").write_text("keep\n")
    (root / "opt/venv/bin").mkdir()
    (root / "opt/venv/bin/python").symlink_to("/usr/bin/python3")
    (root / "tmp").mkdir()
    return root


def test_changes_are_new_changed_and_gone(tmp_path):
    root = make_root(tmp_path)
    masks = ["/tmp", "/wheels"]
    before = rootfs_diff.snapshot(root, masks)
    (root / "opt/venv/lib/old_pkg/__init__.py").unlink()
    (root / "opt/venv/lib/old_pkg").rmdir()
    (root / "opt/venv/lib/new_pkg").mkdir()
    (root / "opt/venv/lib/new_pkg/mod.py").write_text("new\n")
    (root / "tmp/scratch").write_text("masked\n")
    (root / "wheels").mkdir()
    os.utime(root / "opt/venv/lib", ns=(1, 1))
    after = rootfs_diff.snapshot(root, masks)
    changed, removed = rootfs_diff.changes(before, after)
    assert changed == ["opt/venv/lib", "opt/venv/lib/new_pkg", "opt/venv/lib/new_pkg/mod.py"]
    assert removed == ["opt/venv/lib/old_pkg"]  # its file goes with it: one whiteout


def test_nothing_changed_is_an_empty_diff(tmp_path):
    root = make_root(tmp_path)
    snap = rootfs_diff.snapshot(root, [])
    assert rootfs_diff.changes(snap, rootfs_diff.snapshot(root, [])) == ([], [])


def test_layer_carries_content_links_and_whiteouts(tmp_path):
    root = make_root(tmp_path)
    after = rootfs_diff.snapshot(root, [])
    changed = ["opt/venv/bin/python", "opt/venv/lib/keep.py"]
    entries = rootfs_diff.layer_entries(root, changed, ["opt/venv/lib/gone"], after)
    out = tmp_path / "layer.tar"
    layers.write_tar(out, entries, add_parents=False)
    with tarfile.open(out) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile("opt/venv/lib/keep.py").read() == b"keep\n"
    assert set(members) == {"opt/venv/bin/python", "opt/venv/lib/keep.py", "opt/venv/lib/.wh.gone"}
    assert members["opt/venv/bin/python"].issym()
    assert members["opt/venv/bin/python"].linkname == "/usr/bin/python3"
    assert members["opt/venv/lib/keep.py"].mtime == int(
        after["opt/venv/lib/keep.py"].mtime_ns // 1e9
    )


def test_whiteout_names():
    assert rootfs_diff.whiteout("opt/venv/lib/pkg") == "opt/venv/lib/.wh.pkg"
    assert rootfs_diff.whiteout("top") == ".wh.top"
