"""Tool calling for every caller (/v1 and chat sessions): a request's tools, `tool_choice` and `parallel_tool_calls`
(plain OpenAI-shaped values, already bounded by the api layer's Structs) checked and compiled into the engine's
grammar (`plan`), and a reply's text read as content and `tool_calls`, whole or as stream deltas (`ToolReply`).

Calls are enforced, not hoped for: `required` and a named function constrain the reply from its first token,
`auto` from the moment the model writes the call marker (engine/tool_calls.py). A tool's `parameters` that
cannot be enforced is refused naming `tools[i].function.parameters`, by the same rules as `response_format`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from app.domain.errors import ServiceError
from app.domain.response_format import SCHEMA_MAX_BYTES, SCHEMA_MAX_DEPTH, schema_depth
from app.store.records import MessageRecord
from engine.tool_calls import NO_PARAMETERS, Tool, ToolChoice, ToolFormat, tool_grammar
from engine.tool_parser import Piece, ToolCallSplitter
from engine.types import InvalidRequest, ResponseFormat, SamplingParams

if TYPE_CHECKING:
    from engine import Engine

TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")  # a session's settings and a message's overrides


def invalid(param: str, why: str) -> ServiceError:
    return ServiceError("invalid_parameter", f"'{param}' {why}", param=param)


@dataclass(slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt and its reply."""

    fmt: ToolFormat
    render: list[Tool] | None  # the tools the prompt lists (None for tool_choice "none")
    grammar: ResponseFormat | None  # the reply's constraint (None: free text)

    def constrain(self, params: SamplingParams) -> None:
        """Make `params` generate a reply this plan allows: its calls in the grammar, none repeated (the engine ends
        the reply before a call that repeats an earlier one: engine/call_repeats.py). Nothing for tool_choice none."""
        if self.grammar is not None:
            params.response_format = self.grammar
            params.tool_format = self.fmt


def _parameters(param: str, parameters: dict[str, Any] | None) -> str:
    schema = NO_PARAMETERS if parameters is None else parameters
    text = msgspec.json.encode(schema).decode()  # keeps the key order: arguments come in the order given
    if len(text) > SCHEMA_MAX_BYTES:
        raise invalid(param, f"is larger than {SCHEMA_MAX_BYTES // 1024} KiB of JSON")
    if schema_depth(schema) > SCHEMA_MAX_DEPTH:
        raise invalid(param, f"is nested more than {SCHEMA_MAX_DEPTH} levels deep")
    kind = schema.get("type", "object")
    if kind != "object":
        raise invalid(param, f"must describe an object (the arguments), got type {kind!r}")
    if "type" not in schema:
        text = msgspec.json.encode({**schema, "type": "object"}).decode()
    return text


async def plan(
    engine: Engine,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None,
    response_format: bool = False,
    prefix: str = "",
) -> ToolPlan | None:
    """The tool plan (None without `tools`), every schema and the whole grammar compiled: a bad one is refused
    before anything is generated. `tools` are OpenAI's tool objects as plain values; `response_format`: the
    request also constrains the reply that way; `prefix` goes before every field an error names ("settings.")."""
    if tools is None:
        for name, value in (("tool_choice", tool_choice), ("parallel_tool_calls", parallel_tool_calls)):
            if value is not None:
                raise invalid(prefix + name, "is only allowed together with 'tools'")
        return None
    if not tools:
        raise invalid(prefix + "tools", "must list at least one tool (leave it out for none)")
    names = [t["function"]["name"] for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise invalid(f"{prefix}tools[{i}].function.name", f"repeats {name!r}")
    choice = tool_choice or "auto"
    if isinstance(choice, dict):
        named = choice["function"]["name"]
        if named not in names:
            raise invalid(prefix + "tool_choice", f"names the function {named!r}, which is not in 'tools'")
        mode = ToolChoice("function", named)
    else:
        mode = ToolChoice(choice)
    if mode.mode != "none" and response_format:
        raise ServiceError(
            "unsupported_parameter",
            "'response_format' cannot be combined with 'tools' (unless "
            "tool_choice is 'none'): the reply's shape is the tool calls'",
            param="response_format",
        )
    compiled = []
    for i, t in enumerate(tools):
        fn = t["function"]
        param = f"{prefix}tools[{i}].function.parameters"
        params = _parameters(param, fn.get("parameters"))
        try:
            await engine.compile_response_format(ResponseFormat("json_schema", params))
        except InvalidRequest as e:
            why = str(e).removeprefix("response_format json_schema ").removeprefix("response_format ")
            raise invalid(param, why) from None
        compiled.append(Tool(fn["name"], params, fn.get("description") or ""))
    fmt = engine.tool_format
    grammar = tool_grammar(fmt, compiled, mode, parallel_tool_calls is not False)
    if grammar is not None:
        try:
            await engine.compile_response_format(grammar)
        except InvalidRequest as e:
            raise invalid(prefix + "tools", f"cannot be enforced together: {e}") from None
    return ToolPlan(fmt, None if mode.mode == "none" else compiled, grammar)


# -- replies ----------------------------------------------------------------------------------------


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(slots=True)
class ToolReply:
    """One reply read as content and calls; `delta` for streams, `message` at once."""

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
                self.ids.append(call_id())
                calls.append(
                    {
                        "index": p.call,
                        "id": self.ids[p.call],
                        "type": "function",
                        "function": {"name": p.name, "arguments": ""},
                    }
                )
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
        """ "tool_calls" for a reply that ended on its own after whole calls (a stop string can cut one: "stop")."""
        return "tool_calls" if reason == "stop" and self.splitter.calls and self.splitter.complete else reason

    def delta(self, text: str, reason: str | None) -> dict[str, Any]:
        """The stream delta for an event's text (and the held-back rest when it is the last)."""
        pieces = self.splitter.feed(text) if text else []
        if reason is not None:
            pieces += self.splitter.finish()
        return self._delta(pieces)

    def content(self) -> str:
        """The reply's text outside its calls, so far."""
        return "".join(self.splitter.content)

    def calls(self) -> list[dict[str, Any]]:
        """The calls streamed so far as an assistant message's `tool_calls` (the ids the deltas gave)."""
        return [
            {
                "id": self.ids[i] if i < len(self.ids) else call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(self.splitter.calls)
        ]

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as a chat message: `content` (null when only calls) and `tool_calls`."""
        self.splitter.feed(text)
        self.splitter.finish()
        content = "".join(self.splitter.content)
        calls = self.splitter.calls
        msg: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            msg["tool_calls"] = [
                {"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        return msg


# -- chat sessions ----------------------------------------------------------------------------------


def open_calls(branch: list[MessageRecord]) -> tuple[MessageRecord | None, list[str], set[str]]:
    """The chosen branch's last reply with calls, if only its results follow it: (that reply, its call ids,
    the ids already answered); (None, [], set()) when the branch does not end there."""
    answered: set[str] = set()
    for m in reversed(branch):
        if m.role == "tool":
            answered.add(m.tool_call_id or "")
            continue
        if m.role == "assistant" and m.tool_calls:
            return m, [c["id"] for c in m.tool_calls], answered
        break
    return None, [], set()


def check_result(branch: list[MessageRecord], tool_call_id: str) -> MessageRecord:
    """The reply whose call `tool_call_id` names, when the chosen branch ends with that reply (and results of its
    calls) and the call has no result yet; refused naming `tool_call_id` otherwise."""
    reply, ids, answered = open_calls(branch)
    if reply is None:
        raise invalid("tool_call_id", "answers no call: the session's last reply made no tool calls")
    if reply.status != "complete":
        raise invalid("tool_call_id", "answers a reply that did not complete")
    if tool_call_id not in ids:
        raise invalid("tool_call_id", f"{tool_call_id!r} is not a call of the last reply (its calls: {', '.join(ids)})")
    if tool_call_id in answered:
        raise invalid("tool_call_id", f"{tool_call_id!r} already has a result")
    return reply


def check_continue(branch: list[MessageRecord]) -> None:
    """A reply may continue the conversation after tool results once every call of the last reply has one."""
    reply, ids, answered = open_calls(branch)
    if reply is None or not answered:
        raise ServiceError(
            "invalid_parameter",
            "nothing to continue: the session does not end with tool results (post them with tool.result first)",
            param="session_id",
        )
    missing = [i for i in ids if i not in answered]
    if missing:
        raise ServiceError(
            "invalid_parameter",
            f"the last reply's call(s) {', '.join(missing)} have no result yet: post them with tool.result first",
            param="tool_call_id",
        )
