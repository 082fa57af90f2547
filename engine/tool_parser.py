"""A reply's text back into content and tool calls, incrementally (for streams) or at once.

`ToolCallSplitter.feed(text)` takes text deltas of any size and returns what they complete: content, the
start of a call (its index and name, once) and fragments of a call's arguments. Fragments concatenate exactly
to the arguments' JSON; however the text is split into deltas, the same content, names and arguments come out
(tests/unit/test_tool_parser.py). Text that could still become the trigger, and whitespace right before it,
is held back until the next delta tells (whitespace before a call is dropped, not sent as content).

The grammar (engine/tool_calls.py) makes the reply exactly `[text] begin call (separator call)* end`; a
reply cut short (max_tokens, a stop string) leaves its last call's arguments incomplete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.tool_calls import ToolFormat


@dataclass(slots=True)
class Piece:
    """One thing the text completed: `content`, or (call set) a call's start (`name`) or arguments fragment."""

    content: str = ""
    call: int | None = None  # the call's index
    name: str | None = None  # on the call's first piece only
    arguments: str = ""


@dataclass(slots=True)
class Call:
    name: str
    arguments: str = ""


@dataclass(slots=True)
class _Json:
    """Where one JSON value ends, read a character at a time."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    started: bool = False

    def step(self, ch: str) -> bool:
        """Take `ch`; True when it ends the value (an object or array: what arguments are)."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
            return False
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
            self.started = True
        elif ch in "}]":
            self.depth -= 1
            return self.started and self.depth == 0
        return False


@dataclass(slots=True)
class ToolCallSplitter:
    fmt: ToolFormat
    calls: list[Call] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    _buf: str = ""
    _state: str = "text"  # text -> head -> args -> after -> head ... | done; plain: text for good
    _json: _Json = field(default_factory=_Json)

    @property
    def complete(self) -> bool:
        """The reply's calls are all whole (none cut off by max_tokens or a stop string)."""
        return self._state in ("after", "done")

    def only_content(self, text: str) -> bool:
        """Feeding `text` now can give nothing but content: the reply is in its free text and `text` cannot complete
        the call marker (its first character is in neither `text` nor what is held back)."""
        if self._state == "plain":
            return True
        trigger = self.fmt.trigger
        return self._state == "text" and bool(trigger) and trigger[0] not in self._buf and trigger[0] not in text

    def feed(self, text: str) -> list[Piece]:
        """What `text` (the next delta) completes."""
        self._buf += text
        out: list[Piece] = []
        while self._advance(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        """The reply is over: what is still held back (text that did not become a call is content)."""
        out: list[Piece] = []
        if self._state in ("text", "plain") and self._buf:
            out.append(self._say(self._buf))
        self._buf = ""
        return out

    def _say(self, text: str) -> Piece:
        self.content.append(text)
        return Piece(content=text)

    def _advance(self, out: list[Piece]) -> bool:
        """One move of the state machine over the buffer; False when it needs more text."""
        buf, fmt = self._buf, self.fmt
        if self._state == "text" and not fmt.trigger:  # calls only at the very start
            if not buf:
                return False
            self._state = "head" if buf[0] == "{" else "plain"
            return True
        if self._state == "plain":
            if buf:
                out.append(self._say(buf))
                self._buf = ""
            return False
        if self._state == "text":
            at = buf.find(fmt.trigger)
            if at >= 0:
                lead = buf[:at].rstrip()
                if lead:
                    out.append(self._say(lead))
                self._buf, self._state = buf[at + len(fmt.begin) :], "head"
                return True
            keep = _held_back(buf, fmt.trigger)
            if keep < len(buf):
                out.append(self._say(buf[: len(buf) - keep]))
                self._buf = buf[len(buf) - keep :]
            return False
        if self._state == "head":
            m = _head_pattern(fmt).match(buf)
            if m is None:
                return False
            self.calls.append(Call(m.group(1)))
            out.append(Piece(call=len(self.calls) - 1, name=m.group(1)))
            self._buf, self._state, self._json = buf[m.end() :], "args", _Json()
            return True
        if self._state == "args":
            taken = len(buf)
            for i, ch in enumerate(buf):
                if self._json.step(ch):
                    taken = i + 1
                    self._state = "after"
                    break
            if taken:
                self.calls[-1].arguments += buf[:taken]
                out.append(Piece(call=len(self.calls) - 1, arguments=buf[:taken]))
            self._buf = buf[taken:]
            return self._state == "after"
        if self._state == "after":
            nxt = fmt.tail() + fmt.separator + fmt.call_open
            if fmt.parallel and buf.startswith(nxt):
                self._buf, self._state = buf[len(fmt.tail() + fmt.separator) :], "head"
                return True
            if buf.startswith(fmt.tail() + fmt.end) and not nxt.startswith(buf):
                self._buf, self._state = "", "done"  # the end; anything past it is not the model's to say
            return False
        self._buf = ""
        return False


def _held_back(buf: str, trigger: str) -> int:
    """How many trailing characters of `buf` to hold: a prefix of the trigger, and whitespace before it."""
    keep = 0
    for n in range(min(len(trigger) - 1, len(buf)), 0, -1):
        if buf.endswith(trigger[:n]):
            keep = n
            break
    rest = buf[: len(buf) - keep]
    return keep + len(rest) - len(rest.rstrip())


_PATTERNS: dict[ToolFormat, re.Pattern] = {}


def _head_pattern(fmt: ToolFormat) -> re.Pattern:
    pat = _PATTERNS.get(fmt)
    if pat is None:
        pat = re.compile(re.escape(fmt.call_open + '{"name": "') + r'([^"\\]*)' + re.escape(f'", "{fmt.args_key}": '))
        _PATTERNS[fmt] = pat
    return pat


def split_reply(fmt: ToolFormat, text: str) -> tuple[str, list[Call]]:
    """A whole reply: its content (before any call) and its calls."""
    s = ToolCallSplitter(fmt)
    s.feed(text)
    s.finish()
    return "".join(s.content), s.calls
