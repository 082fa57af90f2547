"""Tool calling: the wire formats a model writes its calls in, and the grammar that enforces them.

A reply with calls is `[text] begin call (separator call)* end`, each call being
`call_open {"name": "NAME", "<args_key>": ARGS} call_close` with ARGS valid under that tool's JSON schema
(generated compactly, like every JSON constraint: engine/structured.py). The grammar is llguidance Lark:

- `required`, or one named function: the calls from the first token (one, or one or more when parallel);
- `auto`: free text that never spells the trigger (begin + call_open, trailing whitespace off), or text up to it and the
  calls from there (a lazy lexeme: the text stops at the first trigger). A reply can end either way. A format
  without a trigger (Llama 3.x's bare JSON) calls only at the start: free text never starts with "{";
- `none`: no grammar at all (the caller does not render the tools either).

Nothing may follow the last call but EOS: a call is never followed by more text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.types import ResponseFormat

TOOL_CHOICE_MODES = ("none", "auto", "required", "function")
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(slots=True, frozen=True)
class ToolFormat:
    """How a model writes tool calls (see the module docstring for the shape)."""

    name: str  # shown in /v1/models: the template's own ("hermes", "llama3-json") or "generic" (Forge's)
    call_open: str = "<tool_call>\n"
    call_close: str = "\n</tool_call>"
    separator: str = "\n"
    begin: str = ""
    end: str = ""
    args_key: str = "arguments"
    parallel: bool = True  # False: the template renders one call a turn, so a reply makes one

    @property
    def trigger(self) -> str:
        """What starts the calls in an `auto` reply: its marker without trailing whitespace, so that free text
        cannot spell the marker with other whitespace after it (a call written as text)."""
        return (self.begin + self.call_open).rstrip()

    def head(self, name: str) -> str:
        """A call's text before its arguments."""
        return f'{self.call_open}{{"name": {json.dumps(name)}, "{self.args_key}": '

    def tail(self) -> str:
        """A call's text after its arguments."""
        return "}" + self.call_close

    def render_call(self, name: str, arguments: str) -> str:
        """One call as the model writes it (for assistant turns in the history)."""
        return self.head(name) + arguments + self.tail()


HERMES = ToolFormat("hermes")
GENERIC = ToolFormat("generic")
LLAMA3_JSON = ToolFormat(
    "llama3-json", call_open="", call_close="", separator="", args_key="parameters", parallel=False
)


@dataclass(slots=True, frozen=True)
class Tool:
    """One function the model may call: `parameters` is its arguments' JSON schema, as JSON text."""

    name: str
    parameters: str = json.dumps(NO_PARAMETERS)
    description: str = ""


@dataclass(slots=True, frozen=True)
class ToolChoice:
    """`mode` is one of TOOL_CHOICE_MODES; `name` the function when mode is "function"."""

    mode: str = "auto"
    name: str | None = None


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lark string literal


def closed_objects(schema: object) -> object:
    """`schema` with `additionalProperties: false` on each object schema that lists `properties` and says nothing
    of other properties. A call valid under the result is valid under `schema`; without this a small model pads
    its arguments with invented properties until max_tokens. `allOf` parts are left alone (closing one part
    would refuse the properties of the others)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, object] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            out[key] = {k: closed_objects(v) for k, v in value.items()}
        elif key in ("items", "anyOf", "oneOf", "prefixItems", "additionalProperties"):
            out[key] = closed_objects(value)
        else:
            out[key] = value
    if (
        "properties" in out
        and "additionalProperties" not in out
        and "patternProperties" not in out
        and "unevaluatedProperties" not in out
    ):
        out["additionalProperties"] = False
    return out


def _json_rule(schema_text: str) -> str:
    schema = closed_objects(json.loads(schema_text))
    if isinstance(schema, dict):
        schema = {**schema, "x-guidance": _JSON_OPTIONS}
    return "%json " + json.dumps(schema)


def tool_grammar(fmt: ToolFormat, tools: list[Tool], choice: ToolChoice, parallel: bool) -> ResponseFormat | None:
    """The constraint for a reply to a request with `tools` (None for mode "none": free text)."""
    if choice.mode == "none" or not tools:
        return None
    if choice.mode == "function":
        tools = [t for t in tools if t.name == choice.name]
        if not tools:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
    lines = []
    for i, t in enumerate(tools):
        lines.append(f"call_{i}: {_lark_string(fmt.head(t.name))} args_{i} {_lark_string(fmt.tail())}")
        lines.append(f"args_{i}: {_json_rule(t.parameters)}")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    more = f"({_lark_string(fmt.separator)} call)*" if parallel and fmt.parallel else ""
    end = f" {_lark_string(fmt.end)}" if fmt.end else ""
    if choice.mode == "auto" and not fmt.trigger:
        lines.append(r"TEXT: /([^{](?s:.*))?/")
        lines.insert(0, f"start: TEXT | call {more}{end}")
    elif choice.mode == "auto":
        trigger = fmt.trigger
        # Free text never spells the trigger: where it does, the calls begin (and are enforced).
        lines.append(f"TEXT: /(?s:.*)/ & ~/(?s:.*){_regex_literal(trigger)}(?s:.*)/")
        lines.append(f"lead[lazy]: TEXT {_lark_string(trigger)}")
        # The lead wrote the trigger: the first call's rule starts after it.
        firsts = []
        skip = len(trigger) - len(fmt.begin)
        for i, t in enumerate(tools):
            rest = fmt.head(t.name)[skip:]
            lines.append(f"first_{i}: {_lark_string(rest)} args_{i} {_lark_string(fmt.tail())}")
            firsts.append(f"first_{i}")
        lines.append("first: " + " | ".join(firsts))
        lines.insert(0, f"start: TEXT | lead first {more}{end}")
    else:
        begin = f"{_lark_string(fmt.begin)} " if fmt.begin else ""
        lines.insert(0, f"start: {begin}call {more}{end}")
    return ResponseFormat("grammar", "\n".join(lines) + "\n")


def _regex_literal(text: str) -> str:
    """`text` matched literally inside a Lark /regex/ (which ends at an unescaped slash)."""
    out = []
    for ch in text:
        if ch.isalnum() or ch in " _<>=:,\"'":
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append("\\" + ch if ch in r"\/.^$|?*+()[]{}-" else ch)
    return "".join(out)
