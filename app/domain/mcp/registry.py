"""Every configured MCP server and its tools under namespaced names (`NAME__tool`, spec.SEP): what a session may
choose, what its turns list for the model, and where a call goes. Counts and latencies per tool for /admin and
/metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.domain.mcp.outcome import Outcome
from app.domain.mcp.spec import SEP, TOOL_NAME, ServerSpec

if TYPE_CHECKING:
    from app.domain.mcp.client import McpClient

log = logging.getLogger("forge.mcp")

Observe = Callable[[str, str, str, float], None]  # (server, tool, outcome, seconds): app.metrics.Metrics.mcp_call


@dataclass(slots=True)
class ToolStats:
    """One tool's calls so far, by outcome, and their total time."""

    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    last_ms: float | None = None

    def add(self, outcome: Outcome) -> None:
        self.calls += 1
        self.errors += not outcome.ok
        self.seconds += outcome.seconds
        self.last_ms = round(outcome.seconds * 1000.0, 3)

    def view(self) -> dict[str, Any]:
        mean = round(self.seconds / self.calls * 1000.0, 3) if self.calls else None
        return {"calls": self.calls, "errors": self.errors, "mean_ms": mean, "last_ms": self.last_ms}


@dataclass(slots=True)
class McpTool:
    """A server's tool as the model sees it: the namespaced `name`, its description and argument schema."""

    name: str
    server: str
    tool: str  # the server's own name for it
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """As an OpenAI tool object (what a session's `tools` hold)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(slots=True)
class McpRegistry:
    """The servers by name; a call's limits (`timeout_s`, `result_bytes`) and `observe` for the metrics."""

    specs: Iterable[ServerSpec]
    timeout_s: float = 30.0
    result_bytes: int = 16_384
    observe: Observe | None = None
    clients: dict[str, McpClient] = field(init=False, default_factory=dict)
    stats: dict[str, ToolStats] = field(init=False, default_factory=dict)  # by namespaced name

    def __post_init__(self) -> None:
        specs = list(self.specs)
        if specs:
            # Imported here: the SDK's import builds its pydantic models (~0.7 s), which a server without MCP
            # servers should not wait for at every start.
            from app.domain.mcp.client import McpClient

            self.clients = {s.name: McpClient(s) for s in specs}

    async def start(self) -> None:
        """Start every server and list its tools; one that fails is logged (and tried again on its next use)."""
        await asyncio.gather(*(c.ensure() for c in self.clients.values()))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()))

    def tools(self) -> dict[str, McpTool]:
        """Every tool listed now, by namespaced name (a name the model's tool list cannot carry is left out)."""
        out: dict[str, McpTool] = {}
        for client in self.clients.values():
            for t in client.tools:
                name = client.spec.tool_name(t.name)
                if not TOOL_NAME.fullmatch(name):
                    continue
                schema = dict(t.input_schema or {}) or {"type": "object", "properties": {}}
                out[name] = McpTool(name, client.spec.name, t.name, t.description or "", schema)
        return out

    def owns(self, name: str) -> bool:
        """Whether `name` is in an MCP server's namespace (listed now or not)."""
        server, sep, _ = name.partition(SEP)
        return bool(sep) and server in self.clients

    async def call(self, name: str, arguments: dict[str, Any]) -> Outcome:
        """Run the namespaced tool `name`; an error result (never an exception) when it cannot run."""
        server, _, tool = name.partition(SEP)
        client = self.clients.get(server)
        if client is None:
            return Outcome(f"error: no MCP server is named {server!r}", False, 0.0, "failed")
        try:
            outcome = await client.call(tool, arguments, self.timeout_s, self.result_bytes)
        except asyncio.CancelledError:  # Stop
            if self.observe is not None:
                self.observe(server, tool, "stopped", 0.0)
            raise
        self.stats.setdefault(name, ToolStats()).add(outcome)
        if self.observe is not None:
            self.observe(server, tool, outcome.why, outcome.seconds)
        return outcome

    def snapshot(self) -> list[dict[str, Any]]:
        """The servers for /admin: state, last error, starts, and each tool with its calls and latencies."""
        out = []
        for client in self.clients.values():
            spec = client.spec
            names = [spec.tool_name(t.name) for t in client.tools]
            out.append(
                {
                    "name": spec.name,
                    "transport": "http" if spec.url else "stdio",
                    "state": client.state,
                    "error": client.error,
                    "starts": client.starts,
                    "tools": [{"name": n, **self.stats.get(n, ToolStats()).view()} for n in names],
                }
            )
        return out
