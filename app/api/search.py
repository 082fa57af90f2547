"""`GET /api/search`: the caller's sessions and messages holding the words of a query (app.store.search)."""

from __future__ import annotations

import re
from typing import Annotated, Any

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from app.api.gate import owner
from app.api.openapi import KEYED, errors
from app.domain.errors import ServiceError
from app.store import Store

MAX_QUERY = 200
MAX_LIMIT = 50
# A character besides spaces, with "space" as JSON Schema's (ECMA-262) `\s` has it: Python's own `\s` and
# str.strip() also count U+0085 and U+001C-U+001F, which the published pattern lets through.
NOT_SPACE = r"[^\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_NOT_SPACE = re.compile(NOT_SPACE)


@get("/api/search", responses=errors(*KEYED))
async def search(
    request: Request,
    store: NamedDependency[Store],
    q: Annotated[str, QueryParameter(max_length=MAX_QUERY, pattern=NOT_SPACE)],
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT)] = 20,
) -> dict[str, Any]:
    """Sessions whose title, and messages (of any branch) whose text, hold every word of `q` (plain text:
    quotes and operators are characters); titles first, then messages, best first. `limit`: 1 to 50."""
    if not _NOT_SPACE.search(q) or len(q) > MAX_QUERY:
        raise ServiceError("invalid_parameter", f"'q' must hold 1 to {MAX_QUERY} characters besides spaces", param="q")
    return {"data": await store.search(owner(request.scope), q, limit)}
