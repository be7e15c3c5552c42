"""OpenAPI 3.1 documents of InferGrid's HTTP surfaces, assembled from each part's own schemas.

Each part (the engine, the gateway, the extender) describes its routes as `Operation`s whose
request schemas are built from the same constants its readers check (field names, ranges,
enumerations), and its tests check both directions: a body the schema allows is read, and a
body that breaks one field is refused naming that field. The document is served at
`/openapi.json`, and the fuzzers draw their bodies from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from aiohttp import web

OPENAPI_VERSION: Final = "3.1.0"
OPENAPI_PATH: Final = "/openapi.json"

Schema = dict[str, Any]


@dataclass(frozen=True)
class Response:
    description: str
    schema: Schema | None = None
    content_type: str = "application/json"


@dataclass(frozen=True)
class Operation:
    """One route: its method, path, what it reads (a JSON body, or nothing) and what it answers."""

    method: str
    path: str
    summary: str
    responses: Mapping[int, Response]
    body: Schema | None = None
    tags: tuple[str, ...] = field(default=())


def document(
    title: str, version: str, description: str, operations: list[Operation]
) -> dict[str, Any]:
    """The OpenAPI document of `operations`; a path served twice is a bug of its caller."""
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        methods = paths.setdefault(op.path, {})
        if op.method in methods:
            raise ValueError(f"{op.method.upper()} {op.path} is described twice")
        methods[op.method] = _operation(op)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version, "description": description},
        "paths": paths,
    }


def operations(doc: Mapping[str, Any]) -> list[tuple[str, str, Schema | None]]:
    """(method, path, request body schema or None) of every operation in a document."""
    found = []
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            content = op.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            found.append((method, path, schema))
    return found


def handler(doc: Mapping[str, Any]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A GET handler answering the document, encoded once."""
    body = orjson.dumps(doc)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return serve


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": op.summary,
        "operationId": f"{op.method}{op.path.replace('/', '_').replace('.', '_')}",
        "responses": {str(code): _response(r) for code, r in sorted(op.responses.items())},
    }
    if op.tags:
        out["tags"] = list(op.tags)
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": op.body}},
        }
    return out


def _response(response: Response) -> dict[str, Any]:
    out: dict[str, Any] = {"description": response.description}
    if response.schema is not None or response.content_type != "application/json":
        media: dict[str, Any] = {}
        if response.schema is not None:
            media["schema"] = response.schema
        out["content"] = {response.content_type: media}
    return out
