"""GET /openapi.json: Litestar's schema of the routes plus their request bodies, which the routes decode
themselves (strictly, with msgspec: api/body.py) and Litestar therefore cannot see."""

from __future__ import annotations

import copy
from importlib import metadata
from typing import Any

import msgspec
from litestar import Litestar, Request, Router
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.routes import HTTPRoute

SCHEMA_PATH = "/openapi.json"


def openapi_config() -> OpenAPIConfig:
    """The schema at /openapi.json only: no documentation pages, nothing else under that path."""
    return OpenAPIConfig(
        title="posy",
        version=package_version(),
        openapi_router=Router(SCHEMA_PATH, route_handlers=[], include_in_schema=False),
        use_handler_docstrings=True,  # each route's docstring is its description
        render_plugins=[_WithRequestBodies()],
    )


class _WithRequestBodies(JsonRenderPlugin):
    def __init__(self) -> None:
        super().__init__(path="/")
        self._rendered: bytes | None = None

    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        if self._rendered is None:
            self._rendered = self.render_json(request, with_request_bodies(request.app, openapi_schema))
        return self._rendered


def with_request_bodies(app: Litestar, openapi_schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the schema where each operation whose handler names a `request_body` Struct (an
    opt of its route decorator) requires that Struct's JSON schema as its body."""
    bodies: dict[tuple[str, str], type] = {}
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for method, (handler, _) in route.route_handler_map.items():
                if (wire_type := handler.opt.get("request_body")) is not None:
                    bodies[route.path_format, method.lower()] = wire_type
    wire_types = sorted(set(bodies.values()), key=lambda wire_type: wire_type.__name__)
    refs, components = msgspec.json.schema_components(wire_types, ref_template="#/components/schemas/{name}")
    schema = copy.deepcopy(openapi_schema)
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, component in components.items():
        schemas.setdefault(name, component)
    ref_of = dict(zip(wire_types, refs))
    for (path, method), wire_type in bodies.items():
        schema["paths"][path][method]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref_of[wire_type]}},
        }
    return schema


def package_version() -> str:
    try:
        return metadata.version("posy")
    except metadata.PackageNotFoundError:  # run from a checkout (python -m api) without installing
        return "0+unknown"
