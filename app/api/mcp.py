"""`GET /api/mcp/tools`: the MCP tools a session may choose in its `settings.mcp_tools` (docs/mcp.md), as the
configured servers list them now."""

from __future__ import annotations

from typing import Any

from litestar import get
from litestar.di import NamedDependency
from msgspec import Struct

from app.api.openapi import KEYED, errors
from app.domain.chat import ChatService


class McpToolView(Struct, kw_only=True):
    """One tool: its namespaced `name` (`server__tool`), its server, and what the model reads of it."""

    name: str
    server: str
    description: str
    parameters: dict[str, Any]


class McpToolList(Struct, kw_only=True):
    data: list[McpToolView]


@get("/api/mcp/tools", responses=errors(*KEYED))
async def mcp_tools(chat: NamedDependency[ChatService]) -> McpToolList:
    """The tools of every MCP server, by name (an empty list without servers). A server that failed to start lists
    none until it is running again."""
    listed = chat.mcp.tools() if chat.mcp is not None else {}
    return McpToolList(
        data=[
            McpToolView(name=t.name, server=t.server, description=t.description, parameters=t.parameters)
            for _, t in sorted(listed.items())
        ]
    )
