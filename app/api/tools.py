"""Tool calling on /v1/chat/completions: the request's `tools`, `tool_choice`, `parallel_tool_calls` and tool turns
(msgspec bodies with a bound on every count), their checks, the engine's grammar for them, and the replies'
`tool_calls` (whole, or as stream deltas: engine/tool_parser.py).

Calls are enforced, not hoped for: `required` and a named function constrain the reply from its first token,
`auto` from the moment the model writes the call marker (engine/tool_calls.py). A tool's `parameters` that
cannot be enforced is a 400 naming `tools[i].function.parameters`, by the same rules as `response_format`.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from app.api.errors import ServiceError
from app.api.response_format import SCHEMA_MAX_BYTES, SCHEMA_MAX_DEPTH
from engine.tool_calls import NO_PARAMETERS, Tool, ToolChoice, ToolFormat, tool_grammar
from engine.tool_parser import Piece, ToolCallSplitter
from engine.types import InvalidRequest, ResponseFormat

MAX_TOOLS = 128  # OpenAI's bound
MAX_CALLS = 128  # calls in one assistant message
DESCRIPTION_MAX_CHARS = 8192
ARGUMENTS_MAX_CHARS = 1 << 20
FunctionName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
CallId = Annotated[str, Meta(min_length=1, max_length=256)]


class FunctionDef(Struct, forbid_unknown_fields=True, kw_only=True):
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


ToolDefs = Annotated[list[ToolDef], Meta(max_length=MAX_TOOLS)]
ToolChoiceField = Literal["none", "auto", "required"] | NamedToolChoice
ToolCalls = Annotated[list[ToolCallIn], Meta(min_length=1, max_length=MAX_CALLS)]


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack += [(item, d + 1) for item in (v.values() if isinstance(v, dict) else v)]
    return deepest


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
            raise _invalid(f"{where}.content", "is required (it may be null only on an assistant message with "
                                               "tool_calls)")
        if m.role == "tool":
            if m.tool_call_id is None:
                raise _invalid(f"{where}.tool_call_id", "is required on a tool message")
            if m.tool_call_id not in open_ids:
                raise _invalid(f"{where}.tool_call_id", f"{m.tool_call_id!r} answers no call of the assistant message "
                                                       "before it")
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
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


@dataclass(slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt and its reply."""

    fmt: ToolFormat
    render: list[Tool] | None  # the tools the prompt lists (None for tool_choice "none")
    grammar: ResponseFormat | None  # the reply's constraint (None: free text)


def _parameters(i: int, fn: FunctionDef) -> str:
    param = f"tools[{i}].function.parameters"
    schema = NO_PARAMETERS if fn.parameters is None else fn.parameters
    text = msgspec.json.encode(schema).decode()  # keeps the key order: arguments come in the order given
    if len(text) > SCHEMA_MAX_BYTES:
        raise _invalid(param, f"is larger than {SCHEMA_MAX_BYTES // 1024} KiB of JSON")
    if _depth(schema) > SCHEMA_MAX_DEPTH:
        raise _invalid(param, f"is nested more than {SCHEMA_MAX_DEPTH} levels deep")
    kind = schema.get("type", "object")
    if kind != "object":
        raise _invalid(param, f"must describe an object (the arguments), got type {kind!r}")
    if "type" not in schema:
        text = msgspec.json.encode({**schema, "type": "object"}).decode()
    return text


async def plan(engine: Any, body: Any) -> ToolPlan | None:
    """The request's tool plan (None without `tools`), every schema and the whole grammar compiled: a bad one is a
    400 before anything is generated."""
    if body.tools is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if getattr(body, name) is not None:
                raise _invalid(name, "is only allowed together with 'tools'")
        return None
    if not body.tools:
        raise _invalid("tools", "must list at least one tool (leave it out for none)")
    names = [t.function.name for t in body.tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _invalid(f"tools[{i}].function.name", f"repeats {name!r}")
    choice = body.tool_choice or "auto"
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise _invalid("tool_choice", f"names the function {choice.function.name!r}, which is not in 'tools'")
        mode = ToolChoice("function", choice.function.name)
    else:
        mode = ToolChoice(choice)
    if mode.mode != "none" and body.response_format is not None:
        raise ServiceError("unsupported_parameter", "'response_format' cannot be combined with 'tools' (unless "
                           "tool_choice is 'none'): the reply's shape is the tool calls'", param="response_format")
    tools = []
    for i, t in enumerate(body.tools):
        params = _parameters(i, t.function)
        try:
            await engine.compile_response_format(ResponseFormat("json_schema", params))
        except InvalidRequest as e:
            why = str(e).removeprefix("response_format json_schema ").removeprefix("response_format ")
            raise _invalid(f"tools[{i}].function.parameters", why) from None
        tools.append(Tool(t.function.name, params, t.function.description or ""))
    fmt = engine.tool_format
    parallel = body.parallel_tool_calls is not False
    grammar = tool_grammar(fmt, tools, mode, parallel)
    if grammar is not None:
        try:
            await engine.compile_response_format(grammar)
        except InvalidRequest as e:
            raise _invalid("tools", f"cannot be enforced together: {e}") from None
    return ToolPlan(fmt, None if mode.mode == "none" else tools, grammar)


# -- replies ----------------------------------------------------------------------------------------


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(slots=True)
class ToolReply:
    """One choice's reply read as content and calls; `delta` for streams, `message` at once."""

    fmt: ToolFormat
    splitter: ToolCallSplitter = field(init=False)
    ids: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.splitter = ToolCallSplitter(self.fmt)

    def _delta(self, pieces: list[Piece]) -> dict[str, Any]:
        content = "".join(p.content for p in pieces if p.call is None)
        calls: list[dict[str, Any]] = []
        for p in pieces:
            if p.call is None:
                continue
            if p.name is not None:
                self.ids.append(_call_id())
                calls.append({"index": p.call, "id": self.ids[p.call], "type": "function",
                              "function": {"name": p.name, "arguments": ""}})
            elif calls and calls[-1]["index"] == p.call:  # one entry per call in a delta
                calls[-1]["function"]["arguments"] += p.arguments
            else:
                calls.append({"index": p.call, "function": {"arguments": p.arguments}})
        delta: dict[str, Any] = {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, reason: str | None) -> str | None:
        """"tool_calls" for a reply that ended on its own after whole calls (a stop string can cut one: "stop")."""
        return "tool_calls" if reason == "stop" and self.splitter.calls and self.splitter.complete else reason

    def delta(self, text: str, reason: str | None) -> dict[str, Any]:
        """The stream delta for an event's text (and the held-back rest when it is the last)."""
        pieces = self.splitter.feed(text) if text else []
        if reason is not None:
            pieces += self.splitter.finish()
        return self._delta(pieces)

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as a chat message: `content` (null when only calls) and `tool_calls`."""
        self.splitter.feed(text)
        self.splitter.finish()
        content = "".join(self.splitter.content)
        calls = self.splitter.calls
        msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            msg["tool_calls"] = [{"id": _call_id(), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return msg
