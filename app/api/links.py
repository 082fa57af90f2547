"""OpenAPI links in /schema/openapi.json: where the ids an answer carries lead. A created (or imported) session's
`id` opens every route of that session, a session's messages open their own routes, and the model list opens each
model. Generated clients and Schemathesis' stateful phase follow them from one call to the next."""

from __future__ import annotations

from collections.abc import Callable

from litestar.openapi.spec import OpenAPI, OpenAPIResponse, Operation, PathItem
from litestar.openapi.spec.link import Link

_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
SESSION = "/api/sessions/{session_id}"
MODEL = "/v1/models/{model_id}"


def add_links(openapi: OpenAPI) -> None:
    """Add the links to `openapi`'s answers (in place); a route that is not there is left out."""
    paths = openapi.paths or {}
    session_routes = _operations(
        paths, lambda p: p == SESSION or (p.startswith(SESSION + "/") and "{message_id}" not in p)
    )
    message_routes = _operations(paths, lambda p: p.startswith(SESSION + "/messages/{message_id}"))
    from_body = {"session_id": "$response.body#/id"}
    for path in ("/api/sessions", "/api/sessions/import"):
        _link(paths, path, "post", "201", session_routes, from_body)
    messages = {"session_id": "$request.path.session_id", "message_id": "$response.body#/messages/0/id"}
    _link(paths, SESSION, "get", "200", message_routes, messages)
    _link(
        paths,
        "/v1/models",
        "get",
        "200",
        _operations(paths, lambda p: p == MODEL),
        {"model_id": "$response.body#/data/0/id"},
    )


def _operations(paths: dict[str, PathItem], wanted: Callable[[str], bool]) -> list[Operation]:
    found = []
    for path, item in paths.items():
        if wanted(path):
            found += [op for m in _METHODS if isinstance(op := getattr(item, m, None), Operation) and op.operation_id]
    return found


def _link(
    paths: dict[str, PathItem], path: str, method: str, status: str, targets: list[Operation], params: dict[str, str]
) -> None:
    item = paths.get(path)
    op = getattr(item, method, None) if item is not None else None
    response = (op.responses or {}).get(status) if isinstance(op, Operation) else None
    if not isinstance(response, OpenAPIResponse) or not targets:
        return
    links = dict(response.links or {})
    for target in targets:
        assert target.operation_id is not None
        links[target.operation_id] = Link(operation_id=target.operation_id, parameters=dict(params))
    response.links = links
