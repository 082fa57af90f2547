"""Running an admitted turn: the engine's events go to the turn's sink as `delta`s, the reply is stored as it
grows (noted at most SAVE_INTERVAL_S apart, written with every other reply's in one batch: app/domain/progress.py)
and at the end, then the turn gives back its place and its session.

A turn runs in its own task, independent of the socket or HTTP response that started it: it goes on when the
transport goes away (app/domain/replay.py). When it is stopped the engine aborts the sequence within a step, and
the turn stores what it has as "stopped" (or "interrupted" when the server is shutting down).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from app.domain.admit import Admitter
from app.domain.errors import ServiceError
from app.domain.guard import Guard
from app.domain.progress import Progress
from app.domain.tools import ToolReply
from app.domain.turn import Turn
from app.metrics import Metrics
from app.store import Store
from engine.types import GenerationEvent

if TYPE_CHECKING:
    from engine.engine import RequestStream

log = logging.getLogger("forge.chat")

SAVE_INTERVAL_S = 0.5
FINAL_TRIES = 2

_STATUS = {"stop": "complete", "length": "complete", "tool_calls": "complete", "timeout": "stopped", "error": "error"}


class Runner:
    """Runs turns to their end: streaming, storing, and freeing what they hold (`guard`, `admitter`)."""

    def __init__(self, store: Store, metrics: Metrics, admitter: Admitter, guard: Guard) -> None:
        self.store = store
        self.metrics = metrics
        self.admitter = admitter
        self.guard = guard
        self.progress = Progress(store, SAVE_INTERVAL_S, self._taken)

    def _taken(self, message_ids: set[str]) -> None:
        """Replies another replica marked `interrupted` (it found this one dead): their turns stop, fenced."""
        for turn in list(self.guard.turns.values()):
            if turn.message_id in message_ids and not turn.done:
                log.warning("the reply %s was taken over by another replica; stopping its turn", turn.message_id)
                turn.fenced = turn.cancelled = True
                turn.abort()

    async def run(self, turn: Turn, gen: RequestStream, prompt_len: int) -> None:
        """Until the engine's final event, an abort or `drain`'s cancel; the reply is stored in every case."""
        parts: list[str] = []
        completion = 0
        final: GenerationEvent | None = None
        failure: str | None = None
        killed = False
        tracker = self.metrics.tracker("chat", turn.model.id if turn.model is not None else "default")
        last_save = time.monotonic()
        calls = ToolReply(turn.tool_format) if turn.tool_format is not None else None
        if self.guard.shutting_down:  # interrupt_all() ran while this turn was being set up
            turn.cancelled = True
            turn.abort()
        try:
            try:
                async for ev in gen:
                    tracker.observe(ev)
                    completion += len(ev.token_ids)
                    if calls is not None:
                        self._emit_split(turn, calls, ev, parts)
                    elif ev.text:
                        parts.append(ev.text)
                        turn.emit(
                            {
                                "type": "delta",
                                "session_id": turn.session_id,
                                "message_id": turn.message_id,
                                "text": ev.text,
                            }
                        )
                    if ev.finish_reason is not None:
                        final = ev
                        break
                    if time.monotonic() - last_save >= SAVE_INTERVAL_S:
                        last_save = time.monotonic()
                        self.progress.note(turn.message_id, "".join(parts), completion)
            finally:
                await gen.aclose()
        except asyncio.CancelledError:
            killed = True  # only drain() cancels a turn: store what we have, then stop
        except Exception as e:  # e.g. the engine refused it after admission
            log.error("generation failed in session %s: %r", turn.session_id, e)
            failure = "generation failed"
        finally:
            tracker.close()
            self._release(turn)
        try:
            await self._finish(turn, parts, completion, final, failure, killed, prompt_len, calls)
        except Exception:
            log.exception("could not finish the turn in session %s", turn.session_id)
        finally:
            turn.done = True
            await self.guard.give_back(turn.lease)  # when _finish failed before it
            self.guard.forget(turn)
            turn.sink(None)
        if killed:
            raise asyncio.CancelledError

    def _release(self, turn: Turn) -> None:
        """The generation ended: its place in its model's admission, then its hold on the model."""
        admitter = turn.model.slot.admitter if turn.model is not None else self.admitter
        admitter.release(turn.ticket)
        if turn.model is not None:
            turn.model.release()

    def _emit_split(self, turn: Turn, calls: ToolReply, ev: GenerationEvent, parts: list[str]) -> None:
        """A reply that may call tools: its text as `delta`s, each call's start and argument fragments as
        `tool_call` events (OpenAI's delta shape: `id`, `type` and `name` on a call's first only)."""
        delta = calls.delta(ev.text, ev.finish_reason)
        ids = {"session_id": turn.session_id, "message_id": turn.message_id}
        if delta.get("content"):
            parts.append(delta["content"])
            turn.emit({"type": "delta", **ids, "text": delta["content"]})
        for call in delta.get("tool_calls", ()):
            event = {"type": "tool_call", **ids, "index": call["index"]}
            if "id" in call:
                event.update(id=call["id"], name=call["function"]["name"])
            event["arguments"] = call["function"]["arguments"]
            turn.emit(event)

    async def _finish(
        self,
        turn: Turn,
        parts: list[str],
        completion: int,
        final: GenerationEvent | None,
        failure: str | None,
        killed: bool,
        prompt_len: int,
        calls: ToolReply | None = None,
    ) -> None:
        ids = {"session_id": turn.session_id, "message_id": turn.message_id}
        reason = final.finish_reason if final is not None else ("abort" if (turn.cancelled or killed) else "error")
        assert reason is not None  # `final` is the event that carried one
        if calls is not None:
            reason = calls.finish_reason(reason) or reason
        tool_calls = calls.calls() if calls is not None and reason == "tool_calls" else None
        if reason == "abort":
            status = "interrupted" if self.guard.shutting_down or turn.fenced else "stopped"
        else:
            status = _STATUS.get(reason, "error")
        if final is not None and reason == "error":
            log.error("generation failed in session %s: %s", turn.session_id, final.error)
            failure = "generation failed"  # the engine's detail stays in the log
        usage = final.usage if final is not None and final.usage is not None else None
        prompt_tokens = usage.prompt_tokens if usage else prompt_len
        cached = usage.cached_tokens if usage else None
        completion = usage.completion_tokens if usage else completion
        timings = final.timings if final is not None else None
        ttft_ms = round(timings.ttft * 1000.0, 3) if timings and completion > 0 else None
        total_ms = round(timings.total * 1000.0, 3) if timings else None
        tps = None
        if timings and completion >= 2 and timings.total > timings.ttft:
            tps = round((completion - 1) / (timings.total - timings.ttft), 3)
        await self.progress.settle(turn.message_id)
        if not await self._store_final(
            turn, "".join(parts), status, reason, prompt_tokens, cached, completion, ttft_ms, tps, tool_calls
        ):
            status, failure = "error", failure or "the reply could not be stored"
        await self.guard.give_back(turn.lease)
        turn.lease = None
        self.guard.forget(turn)  # before the last event goes out: a client reacting to it finds the session free
        if failure is not None:
            turn.emit(ServiceError("internal", failure).event(**ids))
        done: dict[str, Any] = {
            "type": "done",
            **ids,
            "status": status,
            "finish_reason": reason,
            "usage": {"prompt_tokens": prompt_tokens, "cached_tokens": cached, "completion_tokens": completion},
            "timings": {"ttft_ms": ttft_ms, "total_ms": total_ms, "tokens_per_s": tps},
        }
        if tool_calls:
            done["tool_calls"] = tool_calls
        turn.emit(done)

    async def _store_final(
        self,
        turn: Turn,
        text: str,
        status: str,
        reason: str,
        prompt_tokens: int,
        cached: int | None,
        completion: int,
        ttft_ms: float | None,
        tps: float | None,
        tool_calls: list[dict] | None = None,
    ) -> bool:
        """The reply's last write, tried twice; if it can't be made, the reply is stored as "error" with a
        smaller write (the client is told so). False when the reply is not stored as `status`."""
        for attempt in range(FINAL_TRIES):
            try:
                await self.store.finish_reply(
                    turn.message_id,
                    content=text,
                    status=status,
                    finish_reason=reason,
                    prompt_tokens=prompt_tokens,
                    cached_tokens=cached,
                    completion_tokens=completion,
                    ttft_ms=ttft_ms,
                    tokens_per_s=tps,
                    tool_calls=tool_calls,
                )
                return True
            except Exception:
                log.exception("could not store the reply %s (attempt %d)", turn.message_id, attempt + 1)
                await asyncio.sleep(0.05 * (attempt + 1))
        try:
            await self.store.set_status(turn.message_id, "error", reason)
        except Exception:  # the database is gone: the next start marks the reply "interrupted"
            log.exception("could not mark the reply %s as failed", turn.message_id)
        return False
