"""Lock files: `name==version --hash=sha256:<hex>` a line, as pip reads them with
--require-hashes; names compared in PEP 503's form; a bad line named by its number."""

import pytest

from images import lockfile

HASH = "a" * 64


def test_parse_reads_pins_and_skips_comments_and_blank_lines():
    text = (
        f"# header\n\nPyYAML==6.0.3 --hash=sha256:{HASH}\n"
        f"  zope.interface==7.0 --hash=sha256:{HASH}\n"
    )
    assert lockfile.parse(text, "deps.txt") == (
        lockfile.Pin("pyyaml", "6.0.3", HASH),
        lockfile.Pin("zope-interface", "7.0", HASH),
    )


@pytest.mark.parametrize(
    "line",
    [
        "pyyaml==6.0.3",  # no hash: pip --require-hashes would refuse it
        f"pyyaml>=6 --hash=sha256:{HASH}",  # not exact
        "pyyaml==6.0.3 --hash=sha256:abc",  # not a sha256
        f"pyyaml==6.0.3 --hash=md5:{HASH}",
    ],
)
def test_parse_names_the_file_and_line_of_anything_else(line):
    with pytest.raises(ValueError, match=r"deps\.txt:2: not `name==version"):
        lockfile.parse(f"# header\n{line}\n", "deps.txt")


def test_render_is_sorted_with_its_header_and_parses_back():
    pins = [lockfile.pin("Zeta", "1", HASH), lockfile.pin("alpha_b", "2", HASH)]
    text = lockfile.render(["made by python -m images.lock", ""], pins)
    assert text.splitlines() == [
        "# made by python -m images.lock",
        "#",
        f"alpha-b==2 --hash=sha256:{HASH}",
        f"zeta==1 --hash=sha256:{HASH}",
    ]
    assert lockfile.parse(text, "x") == tuple(sorted(pins))
    assert lockfile.render(["h"], pins) == lockfile.render(["h"], pins[::-1])


def test_missing_pins_names_absent_and_other_versions():
    pins = (lockfile.pin("kopf", "1.45.2", HASH), lockfile.pin("pyyaml", "6.0.2", HASH))
    assert lockfile.missing_pins(pins, ("kopf==1.45.2", "PyYAML==6.0.2")) == []
    assert lockfile.missing_pins(pins, ("kopf==1.45.3", "numpy==2.4.6", "pyyaml==6.0.2")) == [
        "kopf==1.45.3 is locked at 1.45.2",
        "numpy==2.4.6 is not in the lock",
    ]


def test_an_unpinned_requirement_is_refused_by_name():
    with pytest.raises(ValueError, match="'kopf>=1' is not pinned"):
        lockfile.requirement_pin("kopf>=1")


def test_reading_a_missing_lock_says_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setattr(lockfile, "LOCKS", tmp_path)
    with pytest.raises(FileNotFoundError, match="'deps'.*python -m images.lock"):
        lockfile.read("deps")
