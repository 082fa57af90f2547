"""`ChatPrompt`: a conversation (and its tools) in the model's own chat template, as token ids."""

from __future__ import annotations

from typing import Any

from engine import tool_render
from engine.chat_template import render_chat
from engine.tokenizer import Tokenizer
from engine.tool_calls import Tool, ToolFormat


class ChatPrompt:
    """Renders chats for one model: its tokenizer and its Jinja chat template (None: the default one)."""

    __slots__ = ("tokenizer", "template", "_tool_format")

    def __init__(self, tokenizer: Tokenizer, template: str | None) -> None:
        self.tokenizer, self.template = tokenizer, template
        self._tool_format: ToolFormat | None = None

    @property
    def tool_format(self) -> ToolFormat:
        """How this model writes tool calls (engine/tool_render.py); found once, on first use."""
        if self._tool_format is None:
            tok = self.tokenizer
            self._tool_format = tool_render.format_for(self.template, lambda s: tok.decode(tok.encode_chat(s)) == s)
        return self._tool_format

    def __call__(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[Tool] | None = None
    ) -> list[int]:
        """The conversation as token ids. Message content is text: only the template's own markup yields special
        tokens (content spelling "<|im_end|>" stays those characters). `tools` (and tool turns in `messages`) are
        rendered in `tool_format`."""
        tok = self.tokenizer
        extra: dict[str, Any] = {}
        if tools or any(isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages):
            messages, extra = tool_render.prepare(self.tool_format, messages, tools)
            extra = tool_render.escape_strings(extra, tok.escape_content)
            messages = tool_render.escape_strings(messages, tok.escape_content)
        else:
            messages = [
                {**m, "content": tok.escape_content(m["content"])}
                if isinstance(m, dict) and isinstance(m.get("content"), str)
                else m
                for m in messages
            ]
        text = render_chat(
            self.template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token,
            **extra,
        )
        return tok.encode_chat(text)
