"""A tiny MCP server for the tests, built with the `mcp` SDK: `python tests/mcp_servers/tool_server.py` serves over
stdio, `... http PORT` over streamable HTTP on 127.0.0.1. Its tools: add, hang (never answers), fail (raises), crash
(the process exits), huge (a large result) and grow (adds a tool and tells the client its list changed)."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("forge-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def hang() -> str:
    """Never answers (within a test's time)."""
    await asyncio.sleep(3600)
    return "woke up"


@server.tool()
def fail() -> str:
    """Always raises."""
    raise RuntimeError("failed on purpose")


@server.tool()
def crash() -> str:
    """The server process exits at once."""
    os._exit(3)


@server.tool()
def huge() -> str:
    """A result of 100,000 characters."""
    return "x" * 100_000


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `echo`, then tells the client that the tool list changed."""

    def echo(text: str) -> str:
        """Say it back."""
        return text

    server.add_tool(echo)
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
