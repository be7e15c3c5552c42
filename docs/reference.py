"""The reference pages under docs/reference/, generated from what they describe.

The InferenceService page is read from the CRD the API server enforces, and the engine
settings page from the one table that the operator renders and the engine parses, so the
docs cannot promise a field, default or bound that the cluster or the engine does not have.
`python -m docs.reference` rewrites the pages; `--check` only names the stale ones (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from infergrid.constants import SCHEMA_VERSION
from infergrid.serving_config import (
    CONFIG_ENV,
    CRD_SETTINGS,
    DEFAULT_PORT,
    ENGINE_SETTINGS,
    FORMATS,
    MODEL_NAME_MAX_LENGTH,
    OPERATOR_ONLY,
    TASKS,
    EngineSetting,
    ModelRef,
    encode,
)

ROOT: Final = Path(__file__).resolve().parents[1]
OUT_DIR: Final = ROOT / "docs" / "reference"
CRD_SOURCE: Final = "crds/inferenceservice.yaml"
SETTINGS_SOURCE: Final = "infergrid/serving_config.py"
CRD_PAGE: Final = "inferenceservice.md"
SETTINGS_PAGE: Final = "engine-settings.md"
COMMAND: Final = "python -m docs.reference"
NONE: Final = "—"  # an empty cell reads as "nothing", not as a rendering fault

# Markdown.

_TEXT_ESCAPES: Final = str.maketrans(
    {c: "\\" + c for c in "\\`*_[]|"} | {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
)
_CODE_ENTITIES: Final = {c: f"&#{ord(c)};" for c in "&<>\\`*_[]|"}


def text(prose: str) -> str:
    """Schema prose as one line of plain Markdown: folded, since a table row is one line, and
    escaped, so `<name>` is no HTML tag and `|` no cell border."""
    return " ".join(prose.split()).translate(_TEXT_ESCAPES)


def code(literal: str) -> str:
    """`literal` as code. In a table a bare `|` ends the cell on GitHub, while MkDocs shows
    the backslash of `\\|` in code, so text with a `|` becomes <code> with every Markdown
    character an entity, which both render alike."""
    folded = " ".join(literal.split())
    if "|" not in folded and "`" not in folded:
        return f"`{folded}`"
    return "<code>" + "".join(_CODE_ENTITIES.get(c, c) for c in folded) + "</code>"


def value(data: Any) -> str:
    """A default or enum value: a string as itself, anything else as JSON (`false`, `{}`)."""
    return code(data if isinstance(data, str) and data else json.dumps(data))


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A pipe table, a blank cell shown as NONE; ends with the blank line a block needs."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell or NONE for cell in row) + " |" for row in rows]
    return [*lines, ""]


def generated_note(source: str) -> list[str]:
    """Why nobody should edit the page, and how to change it instead."""
    return [
        f"This page is generated from `{source}` by `{COMMAND}`: do not edit it by hand.",
        f"Change the source, then run `.venv/bin/{COMMAND}`; `{COMMAND} --check` and",
        "`tests/test_docs_reference.py` fail while the page is stale.",
        "",
    ]


def page(lines: Iterable[str]) -> str:
    """The page's text: no trailing spaces, one final newline, whatever the sections end in."""
    return "\n".join(line.rstrip() for line in lines).rstrip("\n") + "\n"


# The InferenceService page, from the CRD.


def crd_page(crd: Mapping[str, Any], source: str = CRD_SOURCE) -> str:
    """Names, `kubectl get` columns, scale paths, then every field of the schema."""
    versions = crd["spec"]["versions"]
    if len(versions) != 1:  # which version's fields to show is a choice this page lacks
        raise ValueError(f"{source}: one version expected, got {len(versions)}")
    version = versions[0]
    schema = version["schema"]["openAPIV3Schema"]
    kind = crd["spec"]["names"]["kind"]
    return page(
        [
            f"# {kind} reference",
            "",
            *generated_note(source),
            text(schema.get("description", "")),
            "",
            *resource_section(crd, version),
            *columns_section(version),
            *scale_section(version),
            *fields_section(schema),
        ]
    )


def resource_section(crd: Mapping[str, Any], version: Mapping[str, Any]) -> list[str]:
    """What `kubectl` and manifests call the resource."""
    spec, names = crd["spec"], crd["spec"]["names"]
    rows = [
        ("Kind", f"{code(names['kind'])} (list: {code(names['listKind'])})"),
        ("API version", code(f"{spec['group']}/{version['name']}")),
        ("Group / version", f"{code(spec['group'])} / {code(version['name'])}"),
        ("Plural / singular", f"{code(names['plural'])} / {code(names['singular'])}"),
        ("Short names", ", ".join(code(n) for n in names.get("shortNames", []))),
        ("Scope", spec["scope"]),
        ("CRD name", code(crd["metadata"]["name"])),
        ("Served / storage", f"{_yes(version['served'])} / {_yes(version['storage'])}"),
        ("Subresources", ", ".join(code(s) for s in version.get("subresources", {}))),
    ]
    return ["## Resource", "", *table(("Property", "Value"), rows)]


def columns_section(version: Mapping[str, Any]) -> list[str]:
    """The printer columns; a column of priority above 0 shows only with `-o wide`."""
    rows = [
        (
            c["name"] + (" (`-o wide`)" if c.get("priority", 0) else ""),
            c["type"],
            code(c["jsonPath"]),
            text(c.get("description", "")),
        )
        for c in version.get("additionalPrinterColumns", [])
    ]
    return [
        "## `kubectl get` columns",
        "",
        *table(("Column", "Type", "JSON path", "Description"), rows),
    ]


def scale_section(version: Mapping[str, Any]) -> list[str]:
    """Where `kubectl scale` and a HorizontalPodAutoscaler read and write replicas."""
    scale = version.get("subresources", {}).get("scale")
    if scale is None:
        return ["## Scale subresource", "", "None.", ""]
    rows = [(code(name), code(path)) for name, path in scale.items()]
    return ["## Scale subresource", "", *table(("Path", "Field"), rows)]


def fields_section(schema: Mapping[str, Any]) -> list[str]:
    """One table per object, depth first in the schema's order."""
    lines = [
        "## Fields",
        "",
        "One table per object, depth first in the schema's order. Each field is named by its",
        "full path; `[]` marks the items of an array.",
        "",
    ]
    for path, node in objects(schema, ""):
        lines += [f"### `{path}`" if path else "### Top level", ""]
        if path and node.get("description"):
            lines += [text(node["description"]), ""]
        lines += table(
            ("Field", "Type", "Required", "Default", "Constraints", "Description"),
            (field_row(p, child, req) for p, child, req in fields(node, path)),
        )
    return lines


def objects(node: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every object with properties, with its path, parents before children."""
    if "properties" in node:
        yield path, node
    for key, child in node.get("properties", {}).items():
        yield from objects(child, _join(path, key))
    if "items" in node:
        yield from objects(node["items"], f"{path}[]")


def fields(
    node: Mapping[str, Any], path: str
) -> Iterator[tuple[str, Mapping[str, Any], bool | None]]:
    """An object's properties, each followed by its items' row if it is an array: the
    items' constraints are their own. Required is None for items (they are no field)."""
    required = node.get("required", [])
    for key, child in node["properties"].items():
        child_path = _join(path, key)
        yield child_path, child, key in required
        while "items" in child:
            child, child_path = child["items"], f"{child_path}[]"
            yield child_path, child, None


def field_row(path: str, node: Mapping[str, Any], required: bool | None) -> list[str]:
    return [
        code(path),
        type_name(node),
        NONE if required is None else _yes(required),
        value(node["default"]) if "default" in node else NONE,
        "<br>".join(constraints(node, path)),
        text(node.get("description", "")),
    ]


def type_name(node: Mapping[str, Any]) -> str:
    """The type as a reader thinks of it: `array of string`, `map of string`, `integer
    (int64)`; an int-or-string field's `type` is absent or either."""
    if node.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if node.get("type") == "array":
        return "array of " + type_name(node["items"])
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping) and "properties" not in node:
        return "map of " + type_name(extra)
    return node["type"] + (f" ({node['format']})" if "format" in node else "")


def _rule(rule: Mapping[str, Any]) -> str:
    message = text(rule["message"]) if "message" in rule else code(rule["messageExpression"])
    where = f" (on {code(rule['fieldPath'])})" if "fieldPath" in rule else ""
    return f"rule {code(rule['rule'])}{where}: {message}"


def _bound(name: str, exclusive: str) -> Callable[[Mapping[str, Any]], list[str]]:
    def show(node: Mapping[str, Any]) -> list[str]:
        suffix = " (exclusive)" if node.get(exclusive) else ""
        return [f"{name}: {json.dumps(node[name])}{suffix}"]

    return show


def _plain(name: str) -> Callable[[Mapping[str, Any]], list[str]]:
    return lambda node: [f"{name}: {json.dumps(node[name])}"]


def _values(node: Mapping[str, Any]) -> list[str]:
    extra = node["additionalProperties"]
    shown = constraints(extra, "additionalProperties") if isinstance(extra, Mapping) else []
    return [f"each value: {c}" for c in shown]


_SHOWN_ELSEWHERE: Final = ("type", "format", "description", "default", "properties", "items",
                           "required")  # fmt: skip
# Each keyword a field may carry, in the order its constraints are listed. A keyword missing
# here fails the generator rather than vanish from the page.
_CONSTRAINTS: Final[dict[str, Callable[[Mapping[str, Any]], list[str]]]] = {
    "enum": lambda n: ["enum: " + ", ".join(value(v) for v in n["enum"])],
    "minimum": _bound("minimum", "exclusiveMinimum"),
    "maximum": _bound("maximum", "exclusiveMaximum"),
    "exclusiveMinimum": lambda n: [],  # shown with minimum
    "exclusiveMaximum": lambda n: [],  # shown with maximum
    "multipleOf": _plain("multipleOf"),
    "minLength": _plain("minLength"),
    "maxLength": _plain("maxLength"),
    "pattern": lambda n: ["pattern: " + code(n["pattern"])],
    "minItems": _plain("minItems"),
    "maxItems": _plain("maxItems"),
    "uniqueItems": _plain("uniqueItems"),
    "minProperties": _plain("minProperties"),
    "maxProperties": _plain("maxProperties"),
    "additionalProperties": _values,
    "nullable": _plain("nullable"),
    "x-kubernetes-int-or-string": lambda n: ["x-kubernetes-int-or-string"],
    "x-kubernetes-preserve-unknown-fields": lambda n: [
        "x-kubernetes-preserve-unknown-fields (unknown fields are kept)"
    ],
    "x-kubernetes-embedded-resource": _plain("x-kubernetes-embedded-resource"),
    "x-kubernetes-list-type": lambda n: [f"x-kubernetes-list-type: {n['x-kubernetes-list-type']}"],
    "x-kubernetes-list-map-keys": lambda n: [
        "x-kubernetes-list-map-keys: " + ", ".join(code(k) for k in n["x-kubernetes-list-map-keys"])
    ],
    "x-kubernetes-map-type": lambda n: [f"x-kubernetes-map-type: {n['x-kubernetes-map-type']}"],
    "x-kubernetes-validations": lambda n: [_rule(r) for r in n["x-kubernetes-validations"]],
}


def constraints(node: Mapping[str, Any], path: str) -> list[str]:
    """Every constraint of one field, in _CONSTRAINTS' order."""
    unknown = [k for k in node if k not in _CONSTRAINTS and k not in _SHOWN_ELSEWHERE]
    if unknown:
        raise ValueError(f"{path}: docs/reference.py cannot show {', '.join(unknown)}")
    return [line for key, show in _CONSTRAINTS.items() if key in node for line in show(node)]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


# The engine settings page, from infergrid.serving_config.

_KINDS: Final = {int: "integer", float: "number", bool: "boolean", tuple: "list of integers",
                 str: "string"}  # fmt: skip


def engine_settings_page(
    settings: Sequence[EngineSetting] = ENGINE_SETTINGS, source: str = SETTINGS_SOURCE
) -> str:
    """Each setting with where it may be set, then the operator's keys and the file."""
    return page(
        [
            "# Engine settings reference",
            "",
            *generated_note(source),
            "The batching engine's settings come from one table, `ENGINE_SETTINGS`. A setting",
            "in the CRD is set in an InferenceService's `spec.engine.<key>`, and the operator",
            "writes it into the serving file's `engine` section under the same key. No other",
            "setting can be set through an InferenceService: it is set in a hand-written serving",
            "file or by the engine's flag (its help says where the operator sets it itself).",
            "Flags override the serving file, which overrides the defaults.",
            "",
            "## Settings",
            "",
            *table(
                ("Key", "Type", "Default", "Bounds or choices", "Flag", "In the CRD", "Help"),
                (setting_row(s) for s in settings),
            ),
            *operator_only_section(),
            *serving_file_section(),
        ]
    )


def setting_row(setting: EngineSetting) -> list[str]:
    return [
        code(setting.key),
        _KINDS[setting.kind],
        value(setting.default),
        bounds(setting),
        flags(setting),
        f"yes: {code('spec.engine.' + setting.key)}"
        if setting.in_crd
        else "no: serving file or flag only",
        text(setting.help),
    ]


def bounds(setting: EngineSetting) -> str:
    """What `EngineSetting.check` accepts, in words."""
    unit = f" {setting.unit}" if setting.unit else ""
    if setting.choices:
        return ", ".join(value(c) for c in setting.choices)
    if setting.kind is int:
        return f"{setting.low} to {setting.high}{unit}"
    if setting.kind is float:
        return f"more than 0, at most {setting.high}{unit}"
    if setting.kind is bool:
        return "true or false"
    return "integers; the flag takes them comma-separated"


def flags(setting: EngineSetting) -> str:
    """A boolean's flag comes with its `--no-` form (argparse's BooleanOptionalAction)."""
    if setting.kind is not bool:
        return code(setting.flag)
    return f"{code(setting.flag)} / {code('--no-' + setting.flag.removeprefix('--'))}"


def operator_only_section() -> list[str]:
    keys = ", ".join(code(f"spec.engine.{k}") for k in OPERATOR_ONLY)
    return [
        "## Operator-only keys",
        "",
        f"{keys}: set in the InferenceService and used by the operator; never written into",
        "the serving file (the engine accepts and ignores them there).",
        "",
    ]


def serving_file_section() -> list[str]:
    """The file's keys, and an example made by the operator's own encoder."""
    example = encode(
        ModelRef("my-model", "pvc://models/my-model", FORMATS[0], TASKS[0]),
        {s.key: s.default for s in CRD_SETTINGS},
    )
    rows = [
        (code("version"), "required", value(SCHEMA_VERSION)),
        (code("port"), value(DEFAULT_PORT), "the engine's HTTP port"),
        (code("model.name"), "required", f"at most {MODEL_NAME_MAX_LENGTH} characters"),
        (code("model.storageUri"), "required", "as `spec.model.storageUri`"),
        (code("model.format"), value(FORMATS[0]), ", ".join(value(f) for f in FORMATS)),
        (code("model.task"), value(TASKS[0]), ", ".join(value(t) for t in TASKS)),
        (code("engine.<key>"), "the setting's default", "the settings above, by key"),
    ]
    return [
        "## Serving file",
        "",
        f"The operator mounts the serving file into every engine pod and sets `{CONFIG_ENV}`",
        f"to its path. The engine reads the file named by `--config`, else by `${CONFIG_ENV}`.",
        "",
        *table(("Key", "Default", "Values"), rows),
        "A serving file with every setting of the CRD at its default:",
        "",
        "```yaml",
        *yaml.safe_dump(example, sort_keys=False).splitlines(),
        "```",
    ]


# The command.


def pages(out: Path = OUT_DIR) -> dict[Path, str]:
    """Each page's path under `out`, with the text it must have."""
    crd = yaml.safe_load((ROOT / CRD_SOURCE).read_text(encoding="utf-8"))
    return {
        out / CRD_PAGE: crd_page(crd),
        out / SETTINGS_PAGE: engine_settings_page(ENGINE_SETTINGS),
    }


def stale(expected: Mapping[Path, str]) -> list[Path]:
    """The pages missing or different from what the sources give now."""
    return [p for p, want in expected.items() if not p.is_file() or p.read_text("utf-8") != want]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="name stale pages; write nothing")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder of the pages")
    args = parser.parse_args(argv)
    expected = pages(args.out)
    outdated = stale(expected)
    if args.check:
        for path in outdated:
            print(f"{path}: stale; run {COMMAND}", file=sys.stderr)
        return 1 if outdated else 0
    for path in outdated:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
