"""Tool calling in request bodies: `tools`, `tool_choice`, `parallel_tool_calls` and /v1's tool turns as msgspec
bodies with a bound on every count, and the tool turns' checks. What /v1 and chat sessions share (the grammar a
request's tools compile to, replies read as `tool_calls`) is the domain's: app/domain/tools.py.

Calls are enforced, not hoped for: `required` and a named function constrain the reply from its first token,
`auto` from the moment the model writes the call marker (engine/tool_calls.py). A tool's `parameters` that
cannot be enforced is a 400 naming `tools[i].function.parameters`, by the same rules as `response_format`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from app.domain.errors import ServiceError
from app.domain.tools import ToolPlan, ToolReply  # noqa: F401  (ToolReply: app/api/openai/chunks.py reads it here)
from app.domain.tools import plan as tool_plan

MAX_TOOLS = 128  # OpenAI's bound
MAX_CALLS = 128  # calls in one assistant message
DESCRIPTION_MAX_CHARS = 8192
ARGUMENTS_MAX_CHARS = 1 << 20
FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]


class FunctionDef(Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):  # stored: no nulls
    name: FunctionName
    description: Annotated[str, Meta(max_length=DESCRIPTION_MAX_CHARS)] | None = None
    parameters: dict[str, Any] | None = None  # None: no arguments ({})
    strict: bool | None = None  # either way the schema is enforced


class ToolDef(Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Struct, forbid_unknown_fields=True):
    name: FunctionName


class NamedToolChoice(Struct, forbid_unknown_fields=True, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


class CallFunction(Struct, forbid_unknown_fields=True, kw_only=True):
    name: FunctionName
    arguments: Annotated[str, Meta(max_length=ARGUMENTS_MAX_CHARS)]


class ToolCallIn(Struct, forbid_unknown_fields=True, kw_only=True):
    """A call in an assistant message of the history."""

    id: CallId
    type: Literal["function"]
    function: CallFunction


# Each function name once, as the hosted APIs require (a JSON schema cannot state it; a repeat gets a 400 naming it).
UNIQUE_NAMES = "The tools, each function name once."
ToolDefs = Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS, description=UNIQUE_NAMES)]
# A session's or a message's tools: at least one (null says none), so the schema states what /v1 checks itself.
SessionToolDefs = Annotated[list[ToolDef], Meta(min_length=1, max_length=MAX_TOOLS, description=UNIQUE_NAMES)]
ToolChoiceField = Literal["none", "auto", "required"] | NamedToolChoice
ToolCalls = Annotated[list[ToolCallIn], Meta(min_length=1, max_length=MAX_CALLS)]


def _invalid(param: str, why: str) -> ServiceError:
    return ServiceError("invalid_parameter", f"'{param}' {why}", param=param)


def check_messages(messages: list[Any]) -> None:
    """Tool turns make sense: content where it is needed, and each `tool` message answers a call of the assistant
    message before it (directly, or after other results of it) by that call's id."""
    open_ids: set[str] = set()
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.tool_calls is not None and m.role != "assistant":
            raise _invalid(f"{where}.tool_calls", "is only allowed on assistant messages")
        if m.tool_call_id is not None and m.role != "tool":
            raise _invalid(f"{where}.tool_call_id", "is only allowed on tool messages")
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise _invalid(
                f"{where}.content", "is required (it may be null only on an assistant message with tool_calls)"
            )
        if m.role == "tool":
            if m.tool_call_id is None:
                raise _invalid(f"{where}.tool_call_id", "is required on a tool message")
            if m.tool_call_id not in open_ids:
                raise _invalid(
                    f"{where}.tool_call_id", f"{m.tool_call_id!r} answers no call of the assistant message before it"
                )
            continue
        open_ids = set()
        if m.tool_calls:
            ids = [c.id for c in m.tool_calls]
            if len(set(ids)) != len(ids):
                raise _invalid(f"{where}.tool_calls", "repeat an id")
            open_ids = set(ids)


def message_dict(m: Any, text: str | None, role: str) -> dict[str, Any]:
    """A checked ChatMessage as the engine's renderer takes it."""
    out: dict[str, Any] = {"role": role, "content": text}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


async def plan(engine: Any, body: Any) -> ToolPlan | None:
    """The request's tool plan (None without `tools`), every schema and the whole grammar compiled: a bad one is a
    400 before anything is generated (app.domain.tools.plan)."""
    return await tool_plan(
        engine,
        builtins(body.tools),
        builtins(body.tool_choice),
        body.parallel_tool_calls,
        response_format=body.response_format is not None,
    )


def builtins(value: Any) -> Any:
    """A decoded Struct (or list of them) as the plain JSON values the domain takes; None stays None."""
    return None if value is None else msgspec.to_builtins(value)


async def check_settings(engine: Any, settings: Any) -> None:
    """A session's `settings.tools` (with the `tool_choice` and `parallel_tool_calls` given beside them) compiled
    now, so a bad one is refused when it is set; a turn checks what the merged settings hold."""
    if settings is None or settings is msgspec.UNSET:
        return
    given = settings.given()
    if given.get("tools") is not None:
        await tool_plan(
            engine, given["tools"], given.get("tool_choice"), given.get("parallel_tool_calls"), prefix="settings."
        )
