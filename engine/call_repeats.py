"""A reply's tool calls without repeats: the first call that repeats an earlier one ends the reply before it.

The tool grammar allows `call (separator call)*`, and a small model under it tends to write the same call again and
again until max_tokens. Two calls are the same when they name the same function with the same arguments as canonical
JSON (keys sorted, no whitespace). `CallRepeats` reads one sample's text as the engine produces it (after the
detokenizer and the stop strings) and decides what may leave:

- text up to the end of each call that is not a repeat goes out as it comes;
- after a whole call, the text is held from the end of that call until the next call's name is known (until then
  it is a prefix of every earlier call's text);
- a call naming a function not called before goes out at once; one naming a function already called is held until
  its arguments end (arguments spelled differently can still be the same JSON, so a textual prefix alone cannot
  clear it): a new call then goes out whole, a repeat is dropped with everything after the previous call, and
  `stopped` tells the engine to end the sample there.

Each piece of text comes with an opaque item (the engine's token and its logprob). An item goes out once some of its
text has, in order, so the tokens of a dropped repeat are never reported either; a reply that ends otherwise (EOS,
max_tokens, an abort) gets everything still held from `finish`.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.tool_calls import ToolFormat
from engine.tool_parser import ToolCallSplitter

T = TypeVar("T")


def canonical(arguments: str) -> str:
    """`arguments` as canonical JSON (sorted keys, no whitespace); as given when it is not JSON."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        return arguments


@dataclass(slots=True)
class CallRepeats(Generic[T]):
    """One sample's text in, the part that may leave out (see the module docstring)."""

    fmt: ToolFormat
    stopped: bool = False  # a repeat came: the sample ends, nothing more goes out
    _splitter: ToolCallSplitter = field(init=False)
    _text: list[str] = field(default_factory=list)  # every character fed and not yet sent
    _fed: int = 0  # characters fed
    _sent: int = 0  # characters sent
    _items: deque[tuple[int, int, T]] = field(default_factory=deque)  # (text start, text end, item), unsent
    _seen: set[tuple[str, str]] = field(default_factory=set)  # (name, canonical arguments) of the calls so far
    _names: set[str] = field(default_factory=set)
    _done: int = 0  # whole calls read
    _name: str = ""  # the call being read
    _args: list[str] = field(default_factory=list)
    _watch: bool = False  # the text from `_cut` on may be a repeat: held
    _cut: int = 0  # where the last whole call's text ends (its tail included)

    def __post_init__(self) -> None:
        self._splitter = ToolCallSplitter(self.fmt)

    def push(self, text: str, item: T) -> tuple[str, list[T]]:
        """Take the next piece of text and its item; return the text and the items that may now leave."""
        if self.stopped:
            return "", []
        start = self._fed
        self._items.append((start, start + len(text), item))
        self._text.append(text)
        self._fed += len(text)
        if self._splitter.only_content(text):  # free text before any call: nothing to place, a character at a time
            self._splitter.feed(text)
        else:
            for i, ch in enumerate(text):
                if self._read(ch, start + i):
                    return self._release(self._cut)
        return self._release(min(self._cut, self._fed) if self._watch else self._fed)

    def finish(self, text: str = "") -> tuple[str, list[T]]:
        """The sample ended (not on a repeat): `text` (the detokenizer's held-back rest) and everything held."""
        if self.stopped:
            return "", []
        self._text.append(text)
        self._fed += len(text)
        return self._release(self._fed, last=True)

    def _read(self, ch: str, at: int) -> bool:
        """Read one character (at offset `at`); True when it completed a repeat (the sample stops)."""
        sp = self._splitter
        for p in sp.feed(ch):
            if p.name is not None:
                self._name, self._args = p.name, []
                self._watch = self._done > 0 and p.name in self._names
            elif p.call is not None:
                self._args.append(p.arguments)
        if not (sp.complete and self._done < len(sp.calls)):
            return False
        self._done += 1
        key = (self._name, canonical("".join(self._args)))
        if self._watch and key in self._seen:
            self.stopped = True
            return True
        self._seen.add(key)
        self._names.add(self._name)
        self._watch = True  # until the next call's name tells
        self._cut = at + 1 + len(self.fmt.tail())
        return False

    def _release(self, upto: int, last: bool = False) -> tuple[str, list[T]]:
        """Send the text before offset `upto` and the items whose text has started to go (all of them when
        `last`); a stopped sample drops the rest."""
        upto = max(upto, self._sent)
        pending = "".join(self._text)
        out = pending[: upto - self._sent]
        self._text = [pending[upto - self._sent :]]
        self._sent = upto
        items: list[T] = []
        while self._items:
            start, end, item = self._items[0]
            if not (last or start < upto or end <= upto):
                break
            items.append(item)
            self._items.popleft()
        if self.stopped:
            self._items.clear()
            self._text = []
        return out, items
