"""The layout read without umoci: tags, sizes, and which blobs gc keeps."""

import hashlib
import json

from images.oci_layout import MANIFEST, Layout


def put(layout_dir, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (layout_dir / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def fake_layout(tmp_path):
    root = tmp_path / "oci"
    (root / "blobs" / "sha256").mkdir(parents=True)
    layer, config = put(root, b"layer"), put(root, b"{}")
    stale = put(root, b"left by a removed tag")
    manifest = json.dumps({"config": config, "layers": [layer]}).encode()
    m = put(root, manifest)
    tag = {"org.opencontainers.image.ref.name": "engine-0123456789ab"}
    index = {"schemaVersion": 2, "manifests": [{"mediaType": MANIFEST, **m, "annotations": tag}]}
    (root / "index.json").write_text(json.dumps(index))
    return Layout(root), m, config, layer, stale


def test_tags_size_and_blobs(tmp_path):
    layout, m, config, layer, _ = fake_layout(tmp_path)
    assert layout.has("engine-0123456789ab") and not layout.has("engine")
    assert layout.size("engine-0123456789ab") == m["size"] + config["size"] + layer["size"]
    assert [b["digest"] for b in layout.blobs("engine-0123456789ab")] == [
        m["digest"], config["digest"], layer["digest"],
    ]  # fmt: skip


def test_gc_deletes_only_blobs_no_tag_reaches(tmp_path):
    layout, m, config, layer, stale = fake_layout(tmp_path)
    assert layout.gc() == stale["size"]
    assert not layout.blob(stale["digest"]).exists()
    assert all(layout.blob(d["digest"]).exists() for d in (m, config, layer))
    assert layout.gc() == 0
