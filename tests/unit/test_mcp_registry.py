"""The MCP registry and client against a real MCP server (tests/mcp_servers/tool_server.py, built with the `mcp`
SDK) over stdio and streamable HTTP: tools listed and namespaced, results, the tool's own error, a timeout that cuts
a hang, a crash and the restart after it, a capped result, and the list refreshed on `list_changed`."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from app.domain.mcp.registry import McpRegistry
from app.domain.mcp.spec import ServerSpec

SERVER = Path(__file__).resolve().parents[1] / "mcp_servers" / "tool_server.py"
STDIO = ServerSpec.parse(f"calc={sys.executable} {SERVER}")
SEEN: list[tuple[str, str, str]] = []  # the registry's metric observations: (server, tool, outcome)


def test_specs_parse_commands_and_urls():
    assert STDIO.command == (sys.executable, str(SERVER)) and STDIO.url is None
    web = ServerSpec.parse("web=http://127.0.0.1:9/mcp")
    assert (web.name, web.url, web.command) == ("web", "http://127.0.0.1:9/mcp", ())
    assert ServerSpec.parse("my_tools=run 'a b'").command == ("run", "a b")
    for bad in ("calc", "calc=", "=cmd", "a__b=cmd", "bad name=cmd"):
        with pytest.raises(ValueError, match="--mcp"):
            ServerSpec.parse(bad)


@pytest.fixture
async def registry() -> AsyncIterator[McpRegistry]:
    SEEN.clear()
    reg = McpRegistry([STDIO], timeout_s=2.0, result_bytes=1000, observe=lambda s, t, o, _: SEEN.append((s, t, o)))
    await reg.start()
    try:
        yield reg
    finally:
        await reg.close()


async def test_tools_are_namespaced_and_called(registry: McpRegistry):
    tools = registry.tools()
    assert {"calc__add", "calc__hang", "calc__fail", "calc__crash", "calc__huge"} <= set(tools)
    add = tools["calc__add"]
    assert (add.server, add.tool) == ("calc", "add")
    assert add.parameters["type"] == "object" and set(add.parameters["properties"]) == {"a", "b"}
    out = await registry.call("calc__add", {"a": 2, "b": 40})
    assert (out.ok, out.content, out.why) == (True, "42", "ok")
    failed = await registry.call("calc__fail", {})
    assert not failed.ok and failed.why == "error" and failed.content.startswith("error:")
    assert registry.clients["calc"].state == "ready"  # the tool's own error leaves the server running
    big = await registry.call("calc__huge", {})
    assert big.ok and "[result truncated: 1000 of 100000 bytes]" in big.content and len(big.content) < 1100
    view = registry.snapshot()[0]
    stats = {t["name"]: t for t in view["tools"]}
    assert (view["state"], stats["calc__add"]["calls"], stats["calc__fail"]["errors"]) == ("ready", 1, 1)
    assert SEEN == [("calc", "add", "ok"), ("calc", "fail", "error"), ("calc", "huge", "ok")]


async def test_a_hang_is_cut_and_a_crash_restarts_the_server(registry: McpRegistry):
    start = time.monotonic()
    hung = await registry.call("calc__hang", {"seconds": 60})
    assert (hung.ok, hung.why) == (False, "timeout") and "did not answer within 2 s" in hung.content
    assert time.monotonic() - start < 10
    assert registry.clients["calc"].state == "failed"
    assert (await registry.call("calc__add", {"a": 1, "b": 2})).content == "3"  # restarted on this use
    assert registry.clients["calc"].starts == 2
    crashed = await registry.call("calc__crash", {})
    assert (crashed.ok, crashed.why) == (False, "failed") and crashed.content.startswith("error:")
    assert (await registry.call("calc__add", {"a": 5, "b": 5})).content == "10"
    assert registry.clients["calc"].starts == 3


async def test_the_tool_list_is_refreshed_on_list_changed(registry: McpRegistry):
    assert "calc__echo" not in registry.tools()
    assert (await registry.call("calc__grow", {})).ok
    deadline = time.monotonic() + 10
    while "calc__echo" not in registry.tools():
        assert time.monotonic() < deadline, "the tool list was not refreshed"
        await asyncio.sleep(0.02)
    assert (await registry.call("calc__echo", {"text": "hi"})).content == "hi"


async def test_an_unknown_server_or_a_broken_command_gives_error_results():
    reg = McpRegistry([ServerSpec.parse("nope=/nonexistent/mcp-server")], timeout_s=2.0)
    await reg.start()
    try:
        assert reg.clients["nope"].state == "failed" and reg.tools() == {}
        out = await reg.call("nope__x", {})
        assert not out.ok and "not running" in out.content
        assert not (await reg.call("other__x", {})).ok
    finally:
        await reg.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url, timeout=1.0)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, "the HTTP MCP server did not start"
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def test_a_streamable_http_server(http_server: str):
    reg = McpRegistry([ServerSpec.parse(f"web={http_server}")], timeout_s=5.0)
    await reg.start()
    try:
        assert "web__add" in reg.tools()
        assert (await reg.call("web__add", {"a": 20, "b": 22})).content == "42"
        assert reg.snapshot()[0]["transport"] == "http"
    finally:
        await reg.close()
