"""Runs an image's chain of stages against the layout, from the last one already there,
then checks the image and tags it.

Every stage adds one layer with `umoci raw add-layer`. The Debian base is mmdebstrap's
tar; a venv stage installs into an unpacked root (umoci unpack, pip in a chroot) and
its layer is what changed there (images.rootfs_diff); the others are tars written here.
The root under an image's packages layer is kept (roots/ in the cache) for its checks.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import debian_base, layers, python_layers, rootfs_diff, runtime_only, smoke
from .components import SITE_PACKAGES, VENV, BinaryImage, Image, PythonImage
from .oci_layout import Layout
from .plan import Stage


class StageRunner:
    def __init__(
        self,
        layout: Layout,
        home: Path,
        files: dict[str, list[tuple[str, Path]]],
        binary_paths: dict[str, Path],
        banned: frozenset[str],
        say: Callable[[str], None],
    ):
        self.layout = layout
        self.work = home / "work"  # scratch, emptied by every build
        self.roots = home / "roots"  # unpacked roots under packages layers, for checks
        self.wheelhouse = home / "wheels"
        self.files = files  # package -> (path in site-packages, file)
        self.binary_paths = binary_paths
        self.banned = banned  # packages no image may carry: images.runtime_only
        self.say = say

    def run(self, image: Image, chain: list[Stage], final_tag: str, labels: dict) -> float:
        """Builds whatever of `chain` is missing, checks the image and tags it; returns
        the seconds it took (0 when it was there already)."""
        tags = self.layout.tags()
        if final_tag in tags:
            return 0.0
        start = time.monotonic()
        done = max((i for i, s in enumerate(chain[:-1]) if s.layout_tag in tags), default=-1)
        parent = chain[done].layout_tag if done >= 0 else None
        rootfs: Path | None = None  # unpacked while venv stages need it
        try:
            for stage in chain[done + 1 : -1]:
                self.say(f"{image.name}: {stage.label}")
                began = time.monotonic()
                if stage.kind == "pip" and rootfs is None:
                    rootfs = self._unpack(parent)
                self._add_layer(image.name, stage, parent, rootfs)
                if rootfs is not None and stage.kind == "pip-target":
                    smoke.lay(rootfs, self._entries(stage))  # keeps the root whole
                parent = stage.layout_tag
                self.say(f"{image.name}: {stage.label}: {time.monotonic() - began:.1f} s")
            if rootfs is not None:  # what lies under the packages layer: kept for checks
                self._keep_root(rootfs, chain[-3].layout_tag)
            began = time.monotonic()
            self._check(image, chain)
            self.say(f"{image.name}: checks passed: {time.monotonic() - began:.1f} s")
        finally:
            if rootfs is not None:
                shutil.rmtree(rootfs.parent.parent, ignore_errors=True)
        self.layout.configure(parent, final_tag, chain[-1].spec, labels)
        return time.monotonic() - start

    def _unpack(self, tag: str) -> Path:
        bundle = Path(tempfile.mkdtemp(prefix="bundle-", dir=self.work)) / "b"
        self.layout.unpack(tag, bundle)
        return bundle / "rootfs"

    def _log(self, name: str) -> Path:
        return self.work / f"{name}.log"

    def _staging(self, stage: Stage) -> Path:
        """Where a pip-target stage's packages were installed in this run."""
        return self.work / f"target-{stage.key[:24]}"

    def _entries(self, stage: Stage) -> list[layers.Entry]:
        """The layer of an app, pip-target or binary stage."""
        if stage.kind == "app":
            return layers.app_entries(stage.spec, self.files)
        if stage.kind == "pip-target":
            return layers.target_entries(self._staging(stage))
        image: BinaryImage = stage.spec
        binary = self.binary_paths[image.binary]
        entries = [layers.Entry(image.path.lstrip("/"), binary, 0o755)]
        return entries + [layers.Entry(d, None, mode) for d, mode in image.dirs]

    def _add_layer(self, name: str, stage: Stage, parent: str | None, rootfs: Path | None):
        say = lambda line: self.say(f"{name}: {line}")  # noqa: E731
        log_file = self._log(name)
        with tempfile.TemporaryDirectory(dir=self.work) as tmp:
            if stage.kind == "debian":
                tar = Path(tmp) / "rootfs.tar"
                debian_base.build_rootfs_tar(stage.spec, tar, log_file, say)
                write = lambda out: _copy(tar, out)  # noqa: E731
            elif stage.kind == "pip":
                entries = self._venv_changes(stage, rootfs, log_file, say)
                write = lambda out: layers.write_tar(out, entries, add_parents=False)  # noqa: E731
            else:
                if stage.kind == "pip-target":
                    staging = self._staging(stage)
                    python_layers.install_target(
                        stage.spec, self.wheelhouse, staging, log_file, say
                    )
                entries = self._entries(stage)
                write = lambda out: layers.write_tar(out, entries)  # noqa: E731
            began = time.monotonic()
            if parent is None:  # the first layer: on an empty image
                empty = f"empty-{stage.key[:24]}"
                self.layout.new(empty)
                try:
                    self.layout.add_layer(empty, stage.layout_tag, stage.label, write)
                finally:
                    self.layout.remove(empty)
            else:
                self.layout.add_layer(parent, stage.layout_tag, stage.label, write)
            say(f"packing the layer (gzip): {time.monotonic() - began:.1f} s")

    def _venv_changes(self, stage: Stage, rootfs: Path, log_file: Path, say) -> list:
        masks = python_layers.MASKS
        before = rootfs_diff.snapshot(rootfs, masks)
        python_layers.install(rootfs, stage.spec, self.wheelhouse, log_file, self.banned, say)
        after = rootfs_diff.snapshot(rootfs, masks)
        changed, removed = rootfs_diff.changes(before, after)
        name = stage.spec.group.name
        say(f"{name} layer: {len(changed)} paths new or changed, {len(removed)} gone")
        return rootfs_diff.layer_entries(rootfs, changed, removed, after)

    def _keep_root(self, rootfs: Path, tag: str) -> None:
        kept = self.roots / tag
        if kept.exists():
            shutil.rmtree(kept)
        self.roots.mkdir(parents=True, exist_ok=True)
        rootfs.rename(kept)

    def _root_of(self, tag: str) -> Path:
        """The kept root of a stage; unpacked again when it is not kept."""
        kept = self.roots / tag
        if not kept.exists():
            self.say(f"unpacking {tag} for the checks (once)")
            rootfs = self._unpack(tag)
            try:
                self._keep_root(rootfs, tag)
            finally:
                shutil.rmtree(rootfs.parent.parent, ignore_errors=True)
        return kept

    def _check(self, image: Image, chain: list[Stage]) -> None:
        packages = self._entries(chain[-2])  # the app or binary stage
        if isinstance(image, PythonImage):
            root = self._root_of(chain[-3].layout_tag)
            site = runtime_only.installed(root / SITE_PACKAGES.lstrip("/"))
            runtime_only.refuse(site, self.banned, f"the {image.name} image's {VENV}")
            with smoke.laid_over(root, packages):
                smoke.run_checks(root, image.run, image.checks, image.name)
        else:
            with tempfile.TemporaryDirectory(dir=self.work) as tmp:
                root = Path(tmp)
                root.chmod(0o755)  # the image's user must reach its programs
                with smoke.laid_over(root, packages):
                    smoke.run_checks(root, image.run, image.checks, image.name)


def _copy(path: Path, out) -> None:
    with path.open("rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
