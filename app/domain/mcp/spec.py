"""`--mcp NAME=COMMAND ARGS…` (a stdio server) or `--mcp NAME=URL` (streamable HTTP): one MCP server to run."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

SEP = "__"  # a namespaced tool's name: server NAME, SEP, the server's own tool name
NAME = re.compile(r"^[A-Za-z0-9-]{1,24}(?:_[A-Za-z0-9-]+)*$")  # no "__": the namespace splits unambiguously
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what a function name may be in the model's tool list


@dataclass(slots=True, frozen=True)
class ServerSpec:
    """One server: its name and either the command that runs it over stdio or its streamable-HTTP URL."""

    name: str
    command: tuple[str, ...] = ()
    url: str | None = None

    @classmethod
    def parse(cls, text: str) -> ServerSpec:
        """ "NAME=COMMAND ARGS…" (split as a shell would) or "NAME=http(s)://…"; ValueError says what is wrong."""
        name, eq, rest = text.partition("=")
        name, rest = name.strip(), rest.strip()
        if not eq or not rest:
            raise ValueError(f"--mcp takes NAME=COMMAND ARGS… or NAME=URL, got {text!r}")
        if not NAME.fullmatch(name):
            raise ValueError(f"--mcp server name {name!r} must be 1 to 24 letters, digits, '-' or single '_' (no '__')")
        if rest.startswith(("http://", "https://")):
            return cls(name, url=rest)
        try:
            command = tuple(shlex.split(rest))
        except ValueError as e:
            raise ValueError(f"--mcp {name}: cannot split the command {rest!r}: {e}") from None
        return cls(name, command=command)

    def tool_name(self, tool: str) -> str:
        """The name a session and the model see for this server's `tool`."""
        return f"{self.name}{SEP}{tool}"
