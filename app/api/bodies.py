"""Every request body and WebSocket command as a msgspec Struct: the app's own bounds live here, once.

Bodies are decoded straight into these types (no intermediate dicts), so deep nesting, numbers beyond
range, NaN and lone surrogates are refused while decoding. `decode` turns every refusal into a
ServiceError naming the field (`param`); the engine checks its own limits (SamplingParams.validate).
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, overload

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from app.api.response_format import ResponseFormatField
from app.api.tools import CallId, SessionToolDefs, ToolCalls, ToolChoiceField
from app.domain.defaults import DEFAULT_TITLE
from app.domain.errors import ServiceError

T = TypeVar("T")

Int = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # the engine checks its own ranges
Count = Annotated[int, Meta(ge=0, le=1 << 40)]
Seconds = Annotated[float, Meta(ge=0, le=1e9)]
Id = Annotated[str, Meta(min_length=1, max_length=64)]
Title = Annotated[str, Meta(max_length=200)]
SystemPrompt = Annotated[str, Meta(max_length=50_000)]
ModelName = Annotated[str, Meta(min_length=1, max_length=200)]  # a served model (/v1/models); null: the default
Content = Annotated[str, Meta(max_length=100_000)]
NON_BLANK = r"\S"  # what a message a user sends must hold (msgspec, like JSON Schema, searches: not anchored)
Said = Annotated[str, Meta(max_length=100_000, pattern=NON_BLANK)]
IMPORT_MAX_MESSAGES = 100_000  # the decoder's bound; Settings.import_messages (lower) is the operator's
MaxTokens = Annotated[int, Meta(ge=1, le=1 << 20)]  # the model's context is the real bound, checked per turn
McpToolName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*__[a-zA-Z0-9_-]+$", max_length=64)]
McpToolNames = Annotated[list[McpToolName], Meta(max_length=128)]  # NAME__tool (app/domain/mcp/spec.py)


# -- sessions ---------------------------------------------------------------------------------------


class SessionSettings(Struct, forbid_unknown_fields=True):
    """Sampling settings of a session; a partial object is merged over the current values."""

    temperature: Annotated[float, Meta(ge=0, le=2)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | UnsetType = UNSET
    max_tokens: MaxTokens | UnsetType = UNSET
    # the tools every turn of the session may call (docs/api.md#tools-in-chat-sessions); null: none
    tools: SessionToolDefs | None | UnsetType = UNSET
    tool_choice: ToolChoiceField | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET
    # the MCP servers' tools its replies may call, run by the server (docs/mcp.md); null: none
    mcp_tools: McpToolNames | None | UnsetType = UNSET
    # true: each MCP call waits for the user's `tool.approve`, unless its tool is in `mcp_allowed` (docs/mcp.md)
    mcp_approval: bool | None | UnsetType = UNSET
    mcp_allowed: McpToolNames | None | UnsetType = UNSET

    def given(self) -> dict[str, Any]:
        """The fields given, as the plain JSON values the store keeps."""
        return {k: msgspec.to_builtins(v) for k in self.__struct_fields__ if (v := getattr(self, k)) is not UNSET}


class ToolOverrides(Struct, forbid_unknown_fields=True, kw_only=True):
    """A message's own tools for its reply, over the session's settings (null `tools`: none this time)."""

    tools: SessionToolDefs | None | UnsetType = UNSET
    tool_choice: ToolChoiceField | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET

    def overrides(self) -> dict[str, Any]:
        """The fields given, as plain JSON values (app.domain.chat.ChatService.send's `tools`)."""
        return {
            k: msgspec.to_builtins(v) for k in ToolOverrides.__struct_fields__ if (v := getattr(self, k)) is not UNSET
        }


class SessionFields(Struct, forbid_unknown_fields=True, kw_only=True):
    """`POST /api/sessions`, `PATCH /api/sessions/{id}`: only the fields given change."""

    title: Title | None | UnsetType = UNSET  # null or blank: "New chat"
    system_prompt: SystemPrompt | None | UnsetType = UNSET  # null: the model's own default
    settings: SessionSettings | UnsetType = UNSET
    model: ModelName | None | UnsetType = UNSET  # the model its turns run on (null: the default)

    def changes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.model is not UNSET:
            out["model"] = self.model
        if self.title is not UNSET:
            out["title"] = (self.title or "").strip() or DEFAULT_TITLE
        if self.system_prompt is not UNSET:
            out["system_prompt"] = self.system_prompt
        if self.settings is not UNSET:
            out["settings"] = self.settings.given()
        return out

    def new_session(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for Store.create_session; settings not given take `defaults` (app.domain.defaults)."""
        changes = self.changes()
        return {
            "title": changes.get("title", DEFAULT_TITLE),
            "system_prompt": changes.get("system_prompt"),
            "settings": {**defaults, **changes.get("settings", {})},
            "model": changes.get("model"),
        }


class EditBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """`POST /api/sessions/{id}/messages/{message_id}/edit`."""

    content: Said


class SendBody(ToolOverrides, kw_only=True):
    """`POST /api/sessions/{id}/messages`."""

    content: Said
    idempotency_key: Id | None = None  # a retried send with the same key is answered, not stored twice
    response_format: ResponseFormatField | None = None  # constrains this reply (docs/api.md#structured-output)


class ToolResultBody(Struct, forbid_unknown_fields=True, kw_only=True):
    """`POST /api/sessions/{id}/tool_results`: the result of a call of the session's last reply."""

    tool_call_id: CallId
    content: Content


class Empty(Struct, forbid_unknown_fields=True):
    """A body that may be left out: `{}` at most."""


class ImportedMessage(Struct, kw_only=True):
    """One message of an export; its other fields (session id, position, dates, siblings) are ignored."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    status: Literal["streaming", "complete", "stopped", "error", "interrupted"] = "complete"
    finish_reason: Annotated[str, Meta(max_length=16)] | None = None
    prompt_tokens: Count | None = None
    cached_tokens: Count | None = None
    completion_tokens: Count | None = None
    ttft_ms: Seconds | None = None
    tokens_per_s: Annotated[float, Meta(ge=0, le=1e9)] | None = None
    tool_calls: ToolCalls | None = None  # a reply's calls
    tool_call_id: CallId | None = None  # a tool message's call
    # version 2 (branches): a reference within the file; the message it follows (null: none, left out: the
    # message before it in the file); whether it is the chosen one of its siblings
    id: Id | None = None
    parent_id: Id | None | UnsetType = UNSET
    active: bool = True


class ImportedSession(Struct, kw_only=True):
    title: Title | None = None
    system_prompt: SystemPrompt | None = None
    settings: SessionSettings | None = None
    model: ModelName | None = None  # one this server serves (null: the default)


class Export(Struct, forbid_unknown_fields=True):
    """`POST /api/sessions/import`: what `GET /api/sessions/{id}/export` gave. Version 1 holds one
    conversation in order; version 2 every branch, each message after its parent (`parent_id`)."""

    forge_export: Literal[1, 2]
    session: ImportedSession
    messages: Annotated[list[ImportedMessage], Meta(max_length=IMPORT_MAX_MESSAGES)]

    def tree(self) -> list[dict[str, Any]]:
        """The messages as Store.import_session takes them: fields, `parent` (index of an earlier message or
        None) and `active`, exactly one chosen per group of siblings (the last marked, else the last)."""
        out: list[dict[str, Any]] = []
        index: dict[str, int] = {}
        for i, m in enumerate(self.messages):
            fields = {f: getattr(m, f) for f in m.__struct_fields__ if f not in ("id", "parent_id", "active")}
            fields["tool_calls"] = msgspec.to_builtins(m.tool_calls) if m.tool_calls else None
            if m.tool_calls and m.role != "assistant":
                raise ServiceError(
                    "invalid_parameter",
                    f"'messages[{i}].tool_calls' is only allowed on assistant messages",
                    param=f"messages[{i}].tool_calls",
                )
            if (m.tool_call_id is not None) != (m.role == "tool"):
                raise ServiceError(
                    "invalid_parameter",
                    f"'messages[{i}].tool_call_id' is required on tool messages and only allowed there",
                    param=f"messages[{i}].tool_call_id",
                )
            previous = i - 1 if i else None
            if self.forge_export == 1:
                out.append({**fields, "parent": previous, "active": True})
                continue
            if m.parent_id is not UNSET and m.parent_id is not None and m.parent_id not in index:
                raise ServiceError(
                    "invalid_parameter",
                    f"'messages[{i}].parent_id' names no earlier message of the export",
                    param=f"messages[{i}].parent_id",
                )
            if m.id is not None:
                if m.id in index:
                    raise ServiceError(
                        "invalid_parameter", f"'messages[{i}].id' repeats an earlier id", param=f"messages[{i}].id"
                    )
                index[m.id] = i
            parent = previous if m.parent_id is UNSET else None if m.parent_id is None else index[m.parent_id]
            out.append({**fields, "parent": parent, "active": m.active})
        chosen: dict[int | None, int] = {}  # parent -> the chosen child
        for i, row in enumerate(out):
            if row["active"] or row["parent"] not in chosen or not out[chosen[row["parent"]]]["active"]:
                chosen[row["parent"]] = i
        picked = set(chosen.values())
        for i, row in enumerate(out):
            row["active"] = i in picked
        return out


# -- WebSocket commands (docs/protocol.md) ------------------------------------------------------------


class Command(Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    client_id: Annotated[str, Meta(max_length=200)] | None = None  # echoed on every answer


class SessionCreate(Command, tag="session.create"):
    title: Title | None | UnsetType = UNSET
    system_prompt: SystemPrompt | None | UnsetType = UNSET
    settings: SessionSettings | UnsetType = UNSET
    model: ModelName | None | UnsetType = UNSET

    def fields(self) -> SessionFields:
        return SessionFields(
            title=self.title, system_prompt=self.system_prompt, settings=self.settings, model=self.model
        )


class SessionOpen(Command, tag="session.open"):
    session_id: Id


class MessageSend(Command, tag="message.send"):
    session_id: Id
    content: Said
    idempotency_key: Id | None = None
    response_format: ResponseFormatField | None = None
    tools: SessionToolDefs | None | UnsetType = UNSET  # this reply's tools, over the session's (ToolOverrides)
    tool_choice: ToolChoiceField | None | UnsetType = UNSET
    parallel_tool_calls: bool | None | UnsetType = UNSET

    def overrides(self) -> dict[str, Any]:
        return ToolOverrides(
            tools=self.tools, tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls
        ).overrides()


class ToolResult(Command, tag="tool.result"):
    """The result of a call of the session's last reply, stored as a `tool` message."""

    session_id: Id
    tool_call_id: CallId
    content: Content


class ToolApprove(Command, tag="tool.approve"):
    """The user's decision on an MCP call awaiting approval (docs/mcp.md#approval)."""

    session_id: Id
    tool_call_id: CallId
    decision: Literal["once", "always", "deny"]


class MessageContinue(Command, tag="message.continue"):
    """A reply after the results of every call of the last one."""

    session_id: Id


class MessageEdit(Command, tag="message.edit"):
    session_id: Id
    message_id: Id
    content: Said


class MessageRegenerate(Command, tag="message.regenerate"):
    session_id: Id


class BranchSelect(Command, tag="branch.select"):
    session_id: Id
    message_id: Id


class GenerationCancel(Command, tag="generation.cancel"):
    session_id: Id


class Ping(Command, tag="ping"):
    pass


class TurnResume(Command, tag="turn.resume"):
    session_id: Id
    after_seq: Count  # the last event of the turn the client has (0: none)
    message_id: Id | None = None  # the reply the client follows: another one (or none running) answers `history`


AnyCommand = (
    SessionCreate
    | SessionOpen
    | MessageSend
    | MessageEdit
    | MessageRegenerate
    | BranchSelect
    | GenerationCancel
    | Ping
    | ToolResult
    | ToolApprove
    | MessageContinue
    | TurnResume
)


class Envelope(Struct):
    """What can be read back from a command that failed to decode, to address the error event."""

    client_id: str | None = None
    session_id: str | None = None


# -- decoding ---------------------------------------------------------------------------------------

_AT = re.compile(r" - at `(?:key` in `)?\$([^`]*)`$")
_FIELD = re.compile(r"Object (missing required|contains unknown) field `([^`]*)`")


@overload
def decode(raw: bytes | str, into: type[T], what: str = ..., unsupported: bool = ...) -> T: ...
@overload
def decode(raw: bytes | str, into: UnionType, what: str = ..., unsupported: bool = ...) -> Any: ...  # AnyCommand


def decode(raw: bytes | str, into: Any, what: str = "request body", unsupported: bool = False) -> Any:
    """Decode JSON `raw` into `into`; a ServiceError naming the field otherwise.

    `unsupported`: unknown fields (and known ones typed `None`) are OpenAI parameters Forge does not
    implement: code `unsupported_parameter` instead of `bad_request`.
    """
    if not raw or (isinstance(raw, bytes) and not raw.strip()):
        raise ServiceError("bad_request", f"{what} is empty; expected a JSON object")
    try:
        return msgspec.json.decode(raw, type=into)
    except msgspec.ValidationError as e:
        if "Expected `int" in str(e) and "got `float`" in str(e):
            return _with_whole_floats(raw, into, e, unsupported)
        raise refusal(str(e), unsupported) from None
    except msgspec.DecodeError as e:
        raise ServiceError("bad_request", f"{what} is not valid JSON: {e}") from None
    except RecursionError:
        raise ServiceError("bad_request", f"{what} is nested too deeply") from None


def _with_whole_floats(raw: bytes | str, into: type[T], error: msgspec.ValidationError, unsupported: bool) -> T:
    """JSON (and JSON Schema's `integer`) does not tell 2.0 from 2: decode again with whole floats as ints.
    Only after a typed decode failed on one, so the ordinary path builds no intermediate objects."""
    try:
        return msgspec.json.decode(msgspec.json.encode(_whole(msgspec.json.decode(raw))), type=into)
    except msgspec.ValidationError as e:
        raise refusal(str(e), unsupported) from None
    except (msgspec.DecodeError, RecursionError):
        raise refusal(str(error), unsupported) from None


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and -(1 << 63) <= value < (1 << 63):
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def refusal(message: str, unsupported: bool = False) -> ServiceError:
    """msgspec's validation message -> a ServiceError with `param` ("settings.temperature", "messages[0].role")."""
    m = _AT.search(message)
    path = m.group(1) if m else ""
    detail = message[: m.start()] if m else message
    path = path.split("[...]", 1)[0].lstrip(".")
    field = _FIELD.match(detail)
    if field:
        name = f"{path}.{field.group(2)}" if path else field.group(2)
        if field.group(1) == "missing required":
            return ServiceError("bad_request", f"'{name}' is required", param=name)
        if unsupported:
            return ServiceError("unsupported_parameter", f"'{name}' is not supported by Forge", param=name)
        return ServiceError("bad_request", f"unknown field '{name}'", param=name)
    param = path or None
    where = f"'{path}'" if path else "the body"
    if detail.startswith("Expected `str` matching regex") and NON_BLANK in detail.replace("\\\\", "\\"):
        return ServiceError("invalid_parameter", f"{where} must not be empty", param=param)
    if unsupported and detail.startswith("Expected `null`"):
        return ServiceError("unsupported_parameter", f"{where} is not supported by Forge", param=param)
    if detail.startswith("Invalid enum") or any(s in detail for s in ("<", ">", "out of range")):
        return ServiceError("invalid_parameter", f"{where} is out of range: {detail}", param=param)
    return ServiceError("bad_request", f"{where} is invalid: {detail}", param=param)
