"""`GET /api/search`: the caller's sessions and messages holding the words of a query (app.store.search)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from app.api.errors import ServiceError
from app.api.gate import owner
from app.api.openapi import KEYED, errors
from app.store import Store

MAX_QUERY = 200
MAX_LIMIT = 50


@get("/api/search", responses=errors(*KEYED))
async def search(
    request: Request,
    store: NamedDependency[Store],
    q: Annotated[str, QueryParameter(max_length=MAX_QUERY, pattern=r"\S")],
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT)] = 20,
) -> dict[str, Any]:
    """Sessions whose title, and messages (of any branch) whose text, hold every word of `q` (plain text:
    quotes and operators are characters); titles first, then messages, best first. `limit`: 1 to 50."""
    if not q.strip() or len(q) > MAX_QUERY:
        raise ServiceError("invalid_parameter", f"'q' must hold 1 to {MAX_QUERY} characters besides spaces", param="q")
    return {"data": await store.search(owner(request.scope), q, limit)}
