"""MCP servers whose tools chat sessions may call (docs/mcp.md): `spec` reads `--mcp`, `client` holds one server's
connection, `registry` all of them with their namespaced tools, `rounds` runs a reply's calls and continues it."""
