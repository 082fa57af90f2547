"""One MCP server's connection through the official `mcp` SDK: started in a task of its own (the SDK's transports
are context managers that must be left by the task that entered them), its tools listed at start and again on
`notifications/tools/list_changed`, and calls that always end: with the result, the server's error, a timeout or
the connection's loss. A server that died or hung is restarted by the next call."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

import msgspec
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from app.domain.mcp.outcome import Outcome
from app.domain.mcp.spec import ServerSpec

log = logging.getLogger("forge.mcp")

START_TIMEOUT_S = 20.0  # starting a server (process, handshake, first tool list)
STOP_TIMEOUT_S = 5.0


def result_text(result: types.CallToolResult) -> str:
    """A tool's result as text: its text parts, other parts (and structured content alone) as JSON."""
    parts = []
    for c in result.content:
        if isinstance(c, types.TextContent):
            parts.append(c.text)
        else:
            parts.append(msgspec.json.encode(c.model_dump(mode="json", exclude_none=True)).decode())
    if not parts and result.structured_content is not None:
        parts.append(msgspec.json.encode(result.structured_content).decode())
    return "\n".join(parts)


def capped(text: str, limit: int) -> str:
    """`text` cut to `limit` bytes of UTF-8, saying so: a huge result must not fill the model's context."""
    data = text.encode()
    if len(data) <= limit:
        return text
    kept = data[:limit].decode(errors="ignore")
    return f"{kept}\n[result truncated: {limit} of {len(data)} bytes]"


class McpClient:
    """A connection to one server; `state` is "stopped", "starting", "ready" or "failed"."""

    def __init__(self, spec: ServerSpec, on_tools: Any = None) -> None:
        self.spec = spec
        self.state = "stopped"
        self.error: str | None = None
        self.tools: list[types.Tool] = []
        self.starts = 0
        self.on_tools = on_tools  # told (no arguments) after each tool list
        self._session: ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()
        self._refreshes: set[asyncio.Task] = set()

    async def ensure(self) -> bool:
        """Started (again, when it failed or stopped); False when it cannot be started now (`error` says why)."""
        async with self._lock:
            if self.state == "ready" and self._task is not None and not self._task.done():
                return True
            await self._halt()
            self.starts += 1
            self.state, self.error = "starting", None
            self._stop, self._ready = asyncio.Event(), asyncio.Event()
            self._task = asyncio.create_task(self._hold(), name=f"mcp-{self.spec.name}")
            try:
                await asyncio.wait_for(self._ready.wait(), START_TIMEOUT_S)
            except TimeoutError:
                self.error = f"did not start within {START_TIMEOUT_S:g} s"
                await self._halt()
                self.state = "failed"
            return self.state == "ready"

    async def _hold(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                if self.spec.url is not None:
                    read, write = await stack.enter_async_context(streamable_http_client(self.spec.url))
                else:
                    cmd = self.spec.command
                    params = StdioServerParameters(command=cmd[0], args=list(cmd[1:]))
                    read, write = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._on_message))
                await session.initialize()
                self._session = session
                await self._list()
                self.state = "ready"
                self._ready.set()
                await self._stop.wait()
        except Exception as e:  # the process would not start, the URL answered badly, the handshake failed...
            self.error = f"{type(e).__name__}: {e}"
            log.warning("MCP server %s failed: %s", self.spec.name, self.error)
        finally:
            self._session = None
            if self.state != "stopped":
                self.state = "failed"
            self._ready.set()

    async def _list(self) -> None:
        session = self._session
        if session is None:
            return
        tools: list[types.Tool] = []
        cursor = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools
        log.info("MCP server %s: %d tool(s): %s", self.spec.name, len(tools), ", ".join(t.name for t in tools))
        if self.on_tools is not None:
            self.on_tools()

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            # Not awaited here: the handler runs in the session's receive loop, which the list request needs.
            task = asyncio.create_task(self._refresh())
            self._refreshes.add(task)
            task.add_done_callback(self._refreshes.discard)

    async def _refresh(self) -> None:
        try:
            await self._list()
        except Exception as e:
            log.warning("MCP server %s: could not list its tools again: %r", self.spec.name, e)

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float, limit: int) -> Outcome:
        """Run `tool`; never raises but for cancellation (Stop). A timeout or a lost connection marks the server
        failed, so the next call restarts it."""
        start = time.monotonic()
        if not await self.ensure():
            why = f"error: the MCP server {self.spec.name} is not running ({self.error})"
            return Outcome(why, False, 0.0, "failed")
        session = self._session
        assert session is not None
        try:
            result = await asyncio.wait_for(session.call_tool(tool, arguments), timeout_s)
        except TimeoutError:
            self._fail(f"a call to {tool} took more than {timeout_s:g} s")
            took = time.monotonic() - start
            return Outcome(f"error: the tool {tool} did not answer within {timeout_s:g} s", False, took, "timeout")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._fail(f"{type(e).__name__}: {e}")
            took = time.monotonic() - start
            return Outcome(f"error: the tool {tool} failed: {e}", False, took, "failed")
        took = time.monotonic() - start
        text = capped(result_text(result), limit)
        if result.is_error:
            return Outcome(f"error: {text}", False, took, "error")
        return Outcome(text, True, took)

    def _fail(self, why: str) -> None:
        log.warning("MCP server %s: %s; restarting it on its next use", self.spec.name, why)
        self.state, self.error = "failed", why

    async def _halt(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        self._stop.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not done:  # a stuck transport: cancel it
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)

    async def close(self) -> None:
        """Stop the server (its process ends with its stdio)."""
        async with self._lock:
            await self._halt()
            self.state = "stopped"
