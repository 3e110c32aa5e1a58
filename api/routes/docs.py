"""GET /docs: the API reference as one HTML page, rendered on the server from the OpenAPI schema (each
route's description, its request fields with their types, defaults, bounds and descriptions, and its
answers); no script and nothing fetched from elsewhere, so it reads offline."""

from __future__ import annotations

import html
import json
from typing import Any

from litestar import Request, Response, get

from api.openapi import SCHEMA_PATH, with_request_bodies

STYLE = (
    "body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "h2{margin-top:2.5rem;font-family:monospace}table{border-collapse:collapse;width:100%}"
    "td,th{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}"
    "code{background:#f4f4f4;padding:0 .2rem}.method{color:#fff;background:#357;padding:0 .4rem}"
)
DOCS_STATE = "posy_docs_page"


@get("/docs", sync_to_thread=False, include_in_schema=False)
def docs(request: Request) -> Response[bytes]:
    page = request.app.state.get(DOCS_STATE)
    if page is None:
        schema = with_request_bodies(request.app, request.app.openapi_schema.to_schema())
        page = request.app.state[DOCS_STATE] = render(schema).encode()
    return Response(content=page, media_type="text/html")  # Litestar adds "; charset=utf-8" to text/*


def render(schema: dict[str, Any]) -> str:
    components = schema.get("components", {}).get("schemas", {})
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>posy API</title><style>{STYLE}</style>",
        f"</head><body><h1>posy {html.escape(schema['info']['version'])}</h1>",
        f"<p>Every route, its request body and its answers; the machine-readable schema is at "
        f"<a href='{SCHEMA_PATH}'><code>{SCHEMA_PATH}</code></a>. Errors come in the called API's shape.</p>",
    ]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            parts.append(f"<h2><span class='method'>{method.upper()}</span> {html.escape(path)}</h2>")
            if operation.get("description"):
                parts.append(f"<p>{html.escape(operation['description'])}</p>")
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            if "$ref" in body.get("schema", {}):
                parts.append(fields_table(components, body["schema"]["$ref"]))
            answers = operation.get("responses", {})
            parts.append(
                "<p>Answers: "
                + ", ".join(
                    f"{html.escape(code)} {html.escape(answer.get('description', ''))}"
                    for code, answer in answers.items()
                )
                + "</p>"
            )
    parts.append("</body></html>")
    return "".join(parts)


def fields_table(components: dict[str, Any], ref: str) -> str:
    component = components[ref.rsplit("/", 1)[-1]]
    required = set(component.get("required", ()))
    rows = ["<table><tr><th>field</th><th>type</th><th>default</th><th>description</th></tr>"]
    for name, field in component.get("properties", {}).items():
        default = "required" if name in required else html.escape(json.dumps(field.get("default")))
        note = field.get("description", "")
        if "minimum" in field:
            note += f" (at least {field['minimum']})"
        if field.get("examples"):
            note += f" Example: {json.dumps(field['examples'][0])}"
        rows.append(
            f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(type_of(field))}</td>"
            f"<td>{default}</td><td>{html.escape(note)}</td></tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def type_of(field: dict[str, Any]) -> str:
    """A JSON-schema type in a few words: string | null, array of string, one of a, b, ..."""
    if "anyOf" in field:
        return " | ".join(type_of(option) for option in field["anyOf"])
    if "enum" in field:
        return "one of " + ", ".join(map(str, field["enum"]))
    if "$ref" in field:
        return field["$ref"].rsplit("/", 1)[-1]
    if field.get("type") == "array":
        return f"array of {type_of(field.get('items', {}))}"
    return str(field.get("type", "any"))
