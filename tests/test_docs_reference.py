"""The generated reference pages (docs/reference/): checked in as the generator writes them,
and showing every field the API server enforces and every setting the engine reads, each
with its default, choices and rules, so a reader never learns a value the cluster refuses.
The page is read back as tables here; the schema is walked on its own, not by the generator."""

from __future__ import annotations

import copy
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from batching_engine.main import parser as engine_parser
from docs import reference
from infergrid.serving_config import CONFIG_ENV, ENGINE_SETTINGS, FORMATS, OPERATOR_ONLY, TASKS

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "inferenceservice.yaml"
REGENERATE = ".venv/bin/python -m docs.reference"


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def schema(crd) -> dict:
    (only,) = crd["spec"]["versions"]
    return only["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def crd_rows() -> dict[str, dict[str, str]]:
    return rows((ROOT / "docs" / "reference" / "inferenceservice.md").read_text())


@pytest.fixture(scope="module")
def settings_page() -> str:
    return (ROOT / "docs" / "reference" / "engine-settings.md").read_text()


def nodes(node: dict, path: str) -> Iterator[tuple[str, dict]]:
    """Every schema node under `path`, by dotted path; an array's items are `path[]`."""
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{key}")
    if "items" in node:
        yield from nodes(node["items"], f"{path}[]")


def spec_and_status(schema: dict) -> Iterator[tuple[str, dict]]:
    for top in ("spec", "status"):
        yield from nodes(schema["properties"][top], top)


def rows(page: str) -> dict[str, dict[str, str]]:
    """Every row of the page's tables by its first cell, as {column: cell}. Cells split on
    unescaped pipes: a literal `|` is written `\\|`, or as an entity inside <code>."""
    found: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in page.splitlines():
        if not line.startswith("|"):
            header = []
        elif line.startswith("| ---"):
            continue
        elif not header:
            header = cells(line)
        else:
            row = dict(zip(header, cells(line), strict=True))
            first = row[header[0]]
            assert first not in found, f"two rows for {first}"
            found[first] = row
    return found


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def shown(value: Any) -> str:
    """How a page writes a default or enum value: a string as itself, anything else as
    JSON, in code."""
    return f"`{value}`" if isinstance(value, str) and value else f"`{json.dumps(value)}`"


def plain(cell: str) -> str:
    """A cell's text as a reader sees it: Markdown escapes and HTML entities undone."""
    return html.unescape(re.sub(r"\\(.)", r"\1", cell))


def test_the_checked_in_pages_are_what_the_generator_writes_now():
    for path, text in reference.pages().items():
        name = path.relative_to(ROOT)
        assert path.is_file(), f"{name} is missing: run {REGENERATE}"
        assert path.read_text() == text, f"{name} is stale: run {REGENERATE}"


@pytest.mark.parametrize("page", ["inferenceservice.md", "engine-settings.md"])
def test_a_page_ends_in_one_newline_and_no_line_in_spaces(page):
    text = (ROOT / "docs" / "reference" / page).read_text()
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert [n for n, line in enumerate(text.splitlines(), 1) if line != line.rstrip()] == []
    assert "do not edit it by hand" in text and "python -m docs.reference" in text


def test_the_crd_page_names_the_resource_its_columns_and_its_scale_paths(crd, crd_rows):
    names, (version,) = crd["spec"]["names"], crd["spec"]["versions"]
    assert names["kind"] in crd_rows["Kind"]["Value"]
    assert f"{crd['spec']['group']}/{version['name']}" in crd_rows["API version"]["Value"]
    assert all(n in crd_rows["Short names"]["Value"] for n in names["shortNames"])
    assert crd_rows["Scope"]["Value"] == crd["spec"]["scope"]
    for column in version["additionalPrinterColumns"]:
        assert crd_rows[column["name"]]["JSON path"] == f"`{column['jsonPath']}`"
    for name, path in version["subresources"]["scale"].items():
        assert crd_rows[f"`{name}`"]["Field"] == f"`{path}`"


def test_every_leaf_field_of_spec_and_status_has_a_row(schema, crd_rows):
    leaves = [p for p, n in spec_and_status(schema) if "properties" not in n and "items" not in n]
    assert {"spec.resources.gpuModels[]", "status.conditions[].status"} <= set(leaves)
    missing = [p for p in leaves if f"`{p}`" not in crd_rows]
    assert missing == [], f"fields with no row: {missing}"


def test_every_field_row_shows_its_enum_default_bounds_and_description(schema, crd_rows):
    for path, node in spec_and_status(schema):
        row = crd_rows[f"`{path}`"]
        for choice in node.get("enum", []):
            assert shown(choice) in row["Constraints"], (path, choice)
        assert row["Default"] == (shown(node["default"]) if "default" in node else "—"), path
        for bound in ("minimum", "maximum", "maxLength", "minItems", "maxItems"):
            if bound in node:
                assert f"{bound}: {node[bound]}" in row["Constraints"], (path, bound)
        if "pattern" in node:
            assert node["pattern"] in html.unescape(row["Constraints"]), path
        assert plain(row["Description"]) == " ".join(node.get("description", "—").split())


def test_every_cel_rule_and_its_message_is_on_its_objects_row(schema, crd_rows):
    rules = [
        (p, r) for p, n in spec_and_status(schema) for r in n.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 6
    for path, rule in rules:
        constraints = plain(crd_rows[f"`{path}`"]["Constraints"])
        assert " ".join(rule["rule"].split()) in constraints, path
        assert " ".join(rule["message"].split()) in constraints, path


def test_each_field_row_says_whether_its_object_requires_it(schema, crd_rows):
    for path, node in spec_and_status(schema):
        for key in node.get("properties", {}):
            wanted = "yes" if key in node.get("required", []) else "no"
            assert crd_rows[f"`{path}.{key}`"]["Required"] == wanted, f"{path}.{key}"


def with_spec_field(crd: dict, key: str, node: dict) -> dict:
    changed = copy.deepcopy(crd)
    spec = changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["model"]["properties"][key] = node
    return changed


def test_a_field_added_to_the_schema_shows_with_its_description_and_bounds(crd):
    node = {"type": "string", "description": "A revision | a tag.", "maxLength": 40}
    page = reference.crd_page(with_spec_field(crd, "revision", node))
    assert page != reference.crd_page(crd)
    row = rows(page)["`spec.model.revision`"]
    assert plain(row["Description"]) == "A revision | a tag."
    assert (row["Type"], row["Constraints"]) == ("string", "maxLength: 40")


def test_a_keyword_the_page_cannot_show_fails_the_generator_naming_the_field(crd):
    node = {"type": "string", "description": "d", "x-kubernetes-future": True}
    with pytest.raises(ValueError, match=r"spec\.model\.odd: .*x-kubernetes-future"):
        reference.crd_page(with_spec_field(crd, "odd", node))


def test_check_names_each_stale_page_and_writes_nothing(tmp_path, capsys):
    assert reference.main(["--check", "--out", str(tmp_path)]) == 1  # none written yet
    assert list(tmp_path.iterdir()) == []
    assert reference.main(["--out", str(tmp_path)]) == 0
    assert reference.main(["--check", "--out", str(tmp_path)]) == 0
    edited = tmp_path / "engine-settings.md"
    edited.write_text(edited.read_text() + "edited by hand\n")
    capsys.readouterr()
    assert reference.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "engine-settings.md" in err and "inferenceservice.md" not in err
    assert "python -m docs.reference" in err
    assert edited.read_text().endswith("edited by hand\n")


def test_every_engine_setting_has_its_key_flag_default_and_crd_place(settings_page):
    table = rows(settings_page)
    for setting in ENGINE_SETTINGS:
        row = table[f"`{setting.key}`"]
        assert f"`{setting.flag}`" in row["Flag"], setting.key
        assert row["Default"] == shown(setting.default), setting.key
        if setting.in_crd:
            assert row["In the CRD"] == f"yes: `spec.engine.{setting.key}`"
        else:
            assert row["In the CRD"].startswith("no") and "spec.engine" not in row["In the CRD"]
    assert any(not s.in_crd for s in ENGINE_SETTINGS)


def test_every_flag_on_the_settings_page_is_one_the_engine_accepts(settings_page):
    accepted = set(engine_parser()._option_string_actions)
    flags = [f for row in rows(settings_page).values() for f in re.findall(r"`(--[^`]+)`",
             row.get("Flag", ""))]  # fmt: skip
    assert "--no-prefix-caching" in flags
    assert set(flags) <= accepted, set(flags) - accepted


def test_the_settings_page_names_the_operators_keys_the_file_env_formats_and_tasks(
    settings_page,
):
    table = rows(settings_page)
    assert all(f"`spec.engine.{key}`" in settings_page for key in OPERATOR_ONLY)
    assert f"`{CONFIG_ENV}`" in settings_page
    assert all(shown(f) in table["`model.format`"]["Values"] for f in FORMATS)
    assert all(shown(t) in table["`model.task`"]["Values"] for t in TASKS)
    assert table["`model.format`"]["Default"] == shown(FORMATS[0])
