"""`GET /api/mcp/tools` against real servers (`python -m app.server`): with the test MCP server (tests/mcp_servers/
tool_server.py) over stdio (the MCP tests' shared server: tests/integration/conftest.py) it lists that server's tools
by namespaced name, with their descriptions and argument schemas; without one the list is empty. Behind the API key
like the rest of /api."""

from __future__ import annotations

import httpx

from tests.integration.conftest import ServerProcess

MCP_TOOLS = {"calc__add", "calc__fail", "calc__hang", "calc__crash", "calc__huge"}


def test_lists_the_servers_tools(mcp_server: ServerProcess) -> None:
    r = httpx.get(mcp_server.url + "/api/mcp/tools", headers=mcp_server.auth, timeout=10)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    by_name = {t["name"]: t for t in data}
    assert set(by_name) >= MCP_TOOLS
    assert [t["name"] for t in data] == sorted(by_name)  # a stable order for the UI
    add = by_name["calc__add"]
    assert add["server"] == "calc"
    assert isinstance(add["description"], str)
    assert add["parameters"]["type"] == "object"
    assert set(add["parameters"]["properties"]) >= {"a", "b"}
    # what the route lists is what a session may choose
    created = httpx.post(
        mcp_server.url + "/api/sessions", json={"settings": {"mcp_tools": ["calc__add"]}}, headers=mcp_server.auth
    )
    assert created.status_code == 201, created.text


def test_empty_without_servers_and_keyed(server: ServerProcess) -> None:
    r = httpx.get(server.url + "/api/mcp/tools", headers=server.auth, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json() == {"data": []}
    assert httpx.get(server.url + "/api/mcp/tools", timeout=10).status_code == 401


def test_in_the_schema(server: ServerProcess) -> None:
    schema = httpx.get(server.url + "/schema/openapi.json", timeout=10).json()
    op = schema["paths"]["/api/mcp/tools"]["get"]
    assert "200" in op["responses"] and "401" in op["responses"]
