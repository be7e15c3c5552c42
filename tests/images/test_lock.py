"""`python -m images.lock`: the locks stack as the layers do, leave out build-only
packages a dependency drags in, and `--check` (offline) says when pyproject.toml's pins
and the committed locks part ways."""

import copy

import pytest

from images import components, lock, lockfile

HASH = "b" * 64


def fake_resolver(calls):
    """pip as far as the locks care: each requirement as asked, and what it drags in."""

    def resolve(requirements, no_deps):
        calls.append((requirements, no_deps))
        pins = [lockfile.pin(*lockfile.requirement_pin(r), HASH) for r in requirements]
        names = {p.name for p in pins}
        if not no_deps and "kopf" in names:
            pins.append(lockfile.pin("typing_extensions", "4.16.0", HASH))
        if not no_deps and "torch" in names:
            pins.append(lockfile.pin("setuptools", "84.2.1", HASH))
        return pins

    return resolve


@pytest.fixture
def generated(pyproject):
    calls = []
    texts = lock.generate(pyproject, fake_resolver(calls))
    return texts, calls


def names(text):
    return [p.name for p in lockfile.parse(text, "x")]


def test_a_lock_per_group_and_one_for_pip(generated):
    texts, _ = generated
    assert list(texts) == ["pip", "deps", "engine", "model"]
    assert names(texts["pip"]) == ["pip"]
    models = sorted(pin.partition("==")[0] for pin in components.MODEL_PACKAGES)
    assert names(texts["model"]) == models


def test_deps_lock_holds_transitive_packages(generated, pyproject):
    texts, _ = generated
    assert "typing-extensions" in names(texts["deps"])
    assert len(names(texts["deps"])) == len(pyproject["project"]["dependencies"]) + 1


def test_engine_is_resolved_over_the_deps_pins_and_holds_only_the_rest(generated):
    texts, calls = generated
    deps_pins = {p.requirement for p in lockfile.parse(texts["deps"], "deps")}
    requirements, no_deps = calls[2]
    assert deps_pins <= set(requirements) and "torch==2.15.0" in requirements and not no_deps
    assert not set(names(texts["engine"])) & set(names(texts["deps"]))
    assert "Resolved over the exact pins of deps.txt" in texts["engine"]


def test_a_transitive_build_only_package_is_left_out_and_said_so(generated):
    texts, _ = generated
    assert "setuptools" not in names(texts["engine"])
    assert "Left out, build- or test-only (images/runtime_only.py): setuptools." in texts["engine"]


def test_locks_are_deterministic_and_say_how_to_regenerate(generated, pyproject):
    texts, _ = generated
    assert lock.generate(pyproject, fake_resolver([])) == texts
    assert all("python -m images.lock" in t.splitlines()[2] for t in texts.values())


def test_check_passes_fresh_locks(generated, pyproject):
    assert lock.check(pyproject, generated[0]) == []


def test_the_committed_locks_hold_pyprojects_pins(pyproject):
    """The offline `python -m images.lock --check`: run python -m images.lock when it fails."""
    assert lock.check(pyproject, lock.committed(pyproject)) == []


def test_check_names_a_changed_pin_a_missing_lock_and_a_bad_line(generated, pyproject):
    texts, _ = generated
    bumped = copy.deepcopy(pyproject)
    deps = bumped["project"]["dependencies"]
    deps[:] = ["kopf==9.9.9" if d.startswith("kopf==") else d for d in deps]
    assert lock.check(bumped, texts) == ["images/locks/deps.txt: kopf==9.9.9 is locked at 1.45.2"]
    assert lock.check(pyproject, {**texts, "model": None}) == [
        "images/locks/model.txt is missing: run python -m images.lock"
    ]
    problems = lock.check(pyproject, {**texts, "pip": "pip==26.3\n"})
    assert problems[0].startswith("images/locks/pip.txt:1: not `name==version")


def test_check_refuses_forbidden_packages_and_packages_locked_twice(generated, pyproject):
    texts, _ = generated
    extra = f"pytest==9.2.0 --hash=sha256:{HASH}\nkopf==1.45.2 --hash=sha256:{HASH}\n"
    assert lock.check(pyproject, {**texts, "engine": texts["engine"] + extra}) == [
        "images/locks/engine.txt: kopf is in deps.txt too",
        "images/locks/engine.txt: pytest is build- or test-only",
    ]
    model = texts["model"] + f"gguf==0.19.0 --hash=sha256:{HASH}\n"
    assert lock.check(pyproject, {**texts, "model": model}) == [
        "images/locks/model.txt: gguf is not a requirement"
    ]


def test_report_argv_resolves_for_the_image_without_this_machines_packages(tmp_path):
    argv = lock.report_argv("py", ("kopf==1.45.2",), tmp_path / "r.json", no_deps=False)
    assert argv[:4] == ["py", "-m", "pip", "install"]
    assert {"--dry-run", "--ignore-installed", "--only-binary=:all:", "--abi=cp311"} <= set(argv)
    assert f"--report={tmp_path / 'r.json'}" in argv and "--no-deps" not in argv
    assert argv[-1] == "kopf==1.45.2"


def test_pins_of_a_report_take_each_wheels_sha256():
    item = {"metadata": {"name": "PyYAML", "version": "6.0.3"},
            "download_info": {"url": "https://x/PyYAML.whl",
                              "archive_info": {"hashes": {"sha256": HASH}}}}  # fmt: skip
    assert lock.pins_of({"install": [item]}) == [lockfile.Pin("pyyaml", "6.0.3", HASH)]
    item["download_info"]["archive_info"] = {}
    with pytest.raises(ValueError, match="no sha256 for PyYAML"):
        lock.pins_of({"install": [item]})
