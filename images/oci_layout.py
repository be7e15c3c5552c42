"""One OCI image layout in the cache, changed only through umoci; read directly.

Every stage of every image is a tag here (`stage-<key>`), every finished image too
(`<name>-<tag>`). umoci (0.4 in bookworm) writes each layer gzip-compressed, and blobs
are shared between tags.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .components import RunConfig

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# Every creation time is the epoch, so a rebuild from equal layers makes an equal digest
# (and containerd, which has it already, is not asked to import it again).
CREATED = "1970-01-01T00:00:00Z"


class UmociError(RuntimeError):
    pass


class Layout:
    def __init__(self, path: Path, umoci: str = "umoci"):
        self.path = path
        self.umoci = umoci

    def _run(self, *args: str) -> str:
        done = subprocess.run([self.umoci, *args], capture_output=True, text=True)
        if done.returncode:
            raise UmociError(f"umoci {' '.join(args)} failed:\n{done.stderr.strip()[-2000:]}")
        return done.stdout

    def _image(self, tag: str) -> str:
        return f"--image={self.path}:{tag}"

    def ensure(self) -> None:
        if not (self.path / "index.json").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._run("init", f"--layout={self.path}")

    def tags(self) -> dict[str, dict]:
        """Tag -> manifest descriptor, from index.json."""
        index = json.loads((self.path / "index.json").read_text())
        return {
            d["annotations"]["org.opencontainers.image.ref.name"]: d
            for d in index.get("manifests") or []
            if "org.opencontainers.image.ref.name" in d.get("annotations", {})
        }

    def has(self, tag: str) -> bool:
        return tag in self.tags()

    def blob(self, digest: str) -> Path:
        algorithm, _, hex_digest = digest.partition(":")
        return self.path / "blobs" / algorithm / hex_digest

    def read_json(self, digest: str) -> dict:
        return json.loads(self.blob(digest).read_bytes())

    def manifest(self, tag: str) -> dict:
        return self.read_json(self.tags()[tag]["digest"])

    def size(self, tag: str) -> int:
        """Bytes of the image's blobs as stored (compressed layers, config, manifest)."""
        desc = self.tags()[tag]
        manifest = self.read_json(desc["digest"])
        return (
            desc["size"] + manifest["config"]["size"] + sum(x["size"] for x in manifest["layers"])
        )

    def blobs(self, tag: str) -> list[dict]:
        """Descriptors of every blob the image needs: manifest, config, layers."""
        desc = self.tags()[tag]
        manifest = self.read_json(desc["digest"])
        return [desc, manifest["config"], *manifest["layers"]]

    def new(self, tag: str) -> None:
        self._run("new", self._image(tag))

    def add_layer(
        self, tag: str, new_tag: str, comment: str, write: Callable[[BinaryIO], None]
    ) -> None:
        """Appends a layer as `new_tag`: `write` writes its uncompressed tar into umoci,
        which compresses it as it reads (no copy of the tar on disk)."""
        argv = [self.umoci, "raw", "add-layer", self._image(tag), f"--tag={new_tag}",
                f"--history.comment={comment}", f"--history.created={CREATED}",
                "/dev/stdin"]  # fmt: skip
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err)
            try:
                write(proc.stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass  # umoci stopped reading: its status and message say why
            finally:
                rc = proc.wait()
            if rc:
                err.seek(0)
                message = err.read().decode(errors="replace").strip()[-2000:]
                raise UmociError(f"umoci raw add-layer {new_tag} failed:\n{message}")

    def unpack(self, tag: str, bundle: Path) -> None:
        self._run("unpack", self._image(tag), str(bundle))

    def configure(self, tag: str, new_tag: str, run: RunConfig, labels: dict[str, str]) -> None:
        args = [self._image(tag), f"--tag={new_tag}", f"--created={CREATED}",
                f"--history.created={CREATED}", "--clear=config.entrypoint",
                "--clear=config.cmd", "--clear=config.env", "--clear=config.exposedports",
                f"--config.user={run.user}", f"--config.workingdir={run.workdir}"]  # fmt: skip
        args += [f"--config.entrypoint={part}" for part in run.entrypoint]
        args += [f"--config.env={k}={v}" for k, v in run.env]
        args += [f"--config.exposedports={port}/tcp" for port in run.ports]
        args += [f"--config.label={k}={v}" for k, v in sorted(labels.items())]
        self._run("config", *args)

    def remove(self, tag: str) -> None:
        self._run("rm", self._image(tag))

    def gc(self) -> int:
        """Deletes the blobs no tag reaches; returns the bytes freed. (umoci gc does the
        same but reads every blob first: over a minute for a layout with the engine.)"""
        index = json.loads((self.path / "index.json").read_text())
        descriptors = index.get("manifests") or []
        if any(d["mediaType"] != MANIFEST for d in descriptors):
            return 0  # not a layout this module wrote: leave it alone
        manifests = [(d["digest"], self.read_json(d["digest"])) for d in descriptors]
        keep = reachable(manifests)
        freed = 0
        for blob in (self.path / "blobs" / "sha256").iterdir():
            if f"sha256:{blob.name}" not in keep:
                freed += blob.stat().st_size
                blob.unlink()
        return freed


def reachable(manifests: list[tuple[str, dict]]) -> set[str]:
    """Digests of the manifests given as (digest, manifest), their configs and layers."""
    keep = set()
    for digest, manifest in manifests:
        keep |= {digest, manifest["config"]["digest"]} | {x["digest"] for x in manifest["layers"]}
    return keep
