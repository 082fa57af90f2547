"""Tools and tool turns into a chat template's messages.

Which format a model gets (`format_for`): a template that renders `tools` itself keeps its own rendering when
its calls are Hermes' `<tool_call>` blocks written as text (Qwen2.5, Hermes: "hermes") or Llama 3.1-3.3's
bare `{"name": .., "parameters": ..}` JSON ("llama3-json": one call a reply, only at its start); every other
template (the default SmolLM2 has no tool support) gets Forge's documented "generic" format, which needs
nothing from the template:

- a system message listing the tools (one JSON line each, inside <tools></tools>) and how to call them:
  one `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` block per call (appended to the
  conversation's own system message when it starts with one);
- an assistant turn's calls as those blocks after its text;
- tool results as a user turn of `<tool_response>\\n...\\n</tool_response>` blocks (consecutive results in one).

Templates whose calls start with a special token (Mistral's `[TOOL_CALLS]`; Llama's `<|python_tag|>` built-in
tools) get the generic format too: those tokens never reach the reply's text, which is what calls are read from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from engine.tool_calls import GENERIC, HERMES, LLAMA3_JSON, Tool, ToolFormat

GENERIC_INSTRUCTIONS = (
    "You can call functions. Their signatures, as JSON schemas, are inside <tools></tools>:\n<tools>\n{tools}\n"
    "</tools>\nTo call a function, reply with one block per call, each holding a JSON object with the function's "
    "name and arguments:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-object>}}\n</tool_call>\n"
    "Otherwise reply in plain text. Results come back inside <tool_response></tool_response>."
)


def format_for(template: str | None, encodes_as_text: Callable[[str], bool]) -> ToolFormat:
    """The tool format for a model's chat template; `encodes_as_text(s)`: s comes back from the reply's text."""
    if not template or not re.search(r"\btools\b", template):
        return GENERIC
    if "<tool_call>" in template and encodes_as_text("<tool_call>") and encodes_as_text("</tool_call>"):
        return HERMES
    if '"parameters": ' in template and "tool_call" in template:  # Llama 3.1-3.3: {"name": .., "parameters": ..}
        return LLAMA3_JSON
    return GENERIC


def _tool_json(t: Tool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name}
    if t.description:
        fn["description"] = t.description
    fn["parameters"] = json.loads(t.parameters)
    return {"type": "function", "function": fn}


def _arguments_value(arguments: str) -> Any:
    """Templates expect arguments as a mapping (they `tojson` it); a string that is not JSON stays a string."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def prepare(fmt: ToolFormat, messages: list[dict], tools: list[Tool] | None) -> tuple[list[dict], dict[str, Any]]:
    """(messages, extra template variables) for `fmt`. Messages are OpenAI-shaped dicts: `content` text (or
    None beside `tool_calls`), `tool_calls` [{id, type, function: {name, arguments (JSON text)}}], role "tool"
    with `tool_call_id`. `tools` None: none rendered (tool_choice "none"); earlier calls still are."""
    if fmt is not GENERIC:  # the template renders tools and calls itself
        out = []
        for m in messages:
            if m.get("tool_calls"):
                calls = [
                    {**c, "function": {**c["function"], "arguments": _arguments_value(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ]
                m = {**m, "content": m.get("content") or "", "tool_calls": calls}
            out.append(m)
        return out, ({"tools": [_tool_json(t) for t in tools]} if tools else {})
    return _generic(fmt, messages, tools), {}


def _generic(fmt: ToolFormat, messages: list[dict], tools: list[Tool] | None) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        role = m["role"]
        if role == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_results": True})
            continue
        if m.get("tool_calls"):
            calls = fmt.separator.join(
                fmt.render_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
            )
            text = (m.get("content") or "").rstrip()
            out.append(
                {
                    "role": role,
                    "content": f"{text}\n{fmt.begin}{calls}{fmt.end}" if text else f"{fmt.begin}{calls}{fmt.end}",
                }
            )
            continue
        out.append({"role": role, "content": m.get("content") or ""})
    out = [{k: v for k, v in m.items() if k != "_results"} for m in out]
    if tools:
        listing = "\n".join(json.dumps(_tool_json(t), ensure_ascii=False) for t in tools)
        prompt = GENERIC_INSTRUCTIONS.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"].rstrip() + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def escape_strings(value: Any, escape: Callable[[str], str]) -> Any:
    """`value` with every string in it escaped (chat content: the special tokens it spells stay text)."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, list):
        return [escape_strings(v, escape) for v in value]
    if isinstance(value, dict):
        return {k: escape_strings(v, escape) for k, v in value.items()}
    return value
