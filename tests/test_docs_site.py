"""The docs site: what `make lint` builds, checked here too, so CI catches a broken link.

The README is the short way in; everything else lives in `docs/`, built by MkDocs with
`--strict`, where a link to a missing page or anchor, a page left out of the nav, or a
README section that a page includes and the README lost fails the build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
# The parts a request or a pod passes through, each a folder of the repository.
PARTS = ("operator", "scheduler_extender", "device_plugin", "batching_engine", "gateway")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the site rooted at `root`, as `make lint` runs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def included_files() -> set[str]:
    """The files outside docs/ that pages include whole or in part (`--8<-- "README.md:tour"`)."""
    found = set()
    for page in (ROOT / "docs").rglob("*.md"):
        for path in re.findall(r'^--8<-- "([^":]+)', page.read_text(), re.M):
            if not path.startswith("docs/"):
                found.add(path)
    return found


def copy_of_the_site(tmp_path: Path) -> Path:
    """The files the site is built from, in a folder of their own to break."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("mkdocs.yml", *included_files()):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_site_builds_strictly(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "inferenceservice" / "index.html").is_file()


@pytest.mark.parametrize(
    "link",
    ["no-such-page.md", "security.md#no-such-section", "#no-such-heading"],
    ids=["page", "anchor on another page", "anchor on the same page"],
)
def test_a_broken_link_fails_the_build_naming_it(tmp_path, link):
    root = copy_of_the_site(tmp_path)
    page = root / "docs" / "gateway.md"
    page.write_text(page.read_text() + f"\nSee [this]({link}).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert link.rpartition("#")[2] in done.stderr


def test_a_readme_section_the_site_includes_cannot_go_missing(tmp_path):
    root = copy_of_the_site(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("[start:tour]", "[start:walk]"))
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert "tour" in done.stderr


def test_the_readme_stays_a_short_page_with_both_commands_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    first = "\n".join(lines[:6])
    assert "make demo" in first and "make test" in first


def test_the_readme_diagram_names_each_part_by_the_folder_that_holds_it():
    text = (ROOT / "README.md").read_text()
    (diagram,) = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    # A part's box ends with its folder: ["operator<br/>operator/"].
    folders = set(re.findall(r"\b([a-z_]+)/\"\]", diagram))
    assert folders >= set(PARTS)
    for folder in folders:
        assert any((ROOT / folder).rglob("*.py")), (
            f"the diagram names {folder}/, which holds no code"
        )
