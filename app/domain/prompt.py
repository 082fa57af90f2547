"""A turn's prompt (the whole conversation through the model's chat template) and its sampling parameters
(the session's settings over the model's recommendation, capped by the room left in the context)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.domain.defaults import session_defaults, turn_extras
from app.domain.errors import ServiceError
from app.store.records import MessageRecord, SessionRecord
from engine.tool_calls import Tool
from engine.types import SamplingParams

if TYPE_CHECKING:
    from engine import Engine


def render(
    engine: Engine,
    session: SessionRecord,
    history: list[MessageRecord],
    tools: list[Tool] | None = None,
    user_content: str | None = None,
) -> list[int]:
    """The prompt's token ids: the session's system prompt, then `history` with its tool calls and results, then
    the new user message (`user_content`, when there is one), the `tools` listed as the model's tool format has it
    (slow on a long conversation: the caller runs it off the event loop)."""
    msgs: list[dict[str, Any]] = []
    if session.system_prompt:
        msgs.append({"role": "system", "content": session.system_prompt})
    for m in history:
        # Replies that failed or never produced text are not part of the conversation; neither is the
        # question they answered (templates may require user/assistant to alternate).
        if m.role == "assistant" and ((not m.content and not m.tool_calls) or m.status == "error"):
            if msgs and msgs[-1]["role"] == "user":
                msgs.pop()
            continue
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = m.tool_calls
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        msgs.append(msg)
    if user_content is not None:
        msgs.append({"role": "user", "content": user_content})
    try:
        return list(engine.render_chat(msgs, add_generation_prompt=True, tools=tools))
    except ValueError as e:
        raise ServiceError("invalid_parameter", f"the model's chat template refused the conversation: {e}") from None


def sampling(engine: Engine, settings: dict[str, Any], prompt_len: int) -> SamplingParams:
    """The session's `settings` over the model's recommendation; refused when the prompt leaves no room."""
    room = int(engine.max_context) - prompt_len
    if room < 1:
        raise ServiceError(
            "invalid_parameter",
            f"the conversation is {prompt_len} tokens; the model's context is "
            f"{engine.max_context}: start a new session or edit an earlier message",
            param="content",
        )
    merged = {**session_defaults(engine), **settings}
    return SamplingParams(
        max_tokens=min(int(merged["max_tokens"]), room),
        temperature=float(merged["temperature"]),
        top_p=float(merged["top_p"]),
        **turn_extras(engine),
    )
