"""One chat turn: store the user message, render the whole conversation, stream the engine's reply,
store the reply as it grows (at most SAVE_INTERVAL_S apart, and at the end).

A turn runs in its own task, independent of the socket or HTTP response that started it: the
transport only receives its events through a `sink`. When the transport goes away it calls
`cancel`, the engine aborts the sequence within a step, and the turn stores what it has as
"stopped" (or "interrupted" when the server is shutting down).
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, SamplingParams

from app.admission import Admission, QueueFull, QueueTimeout, Ticket
from app.api.bodies import DEFAULT_TITLE
from app.api.errors import ServiceError
from app.api.response_format import ResponseFormatField, compile_response_format
from app.defaults import session_defaults, turn_extras
from app.metrics import Metrics
from app.store import Conflict, Store

log = logging.getLogger("forge.chat")

SAVE_INTERVAL_S = 0.5
FINAL_TRIES = 2
TITLE_CHARS = 60
Sink = Callable[[dict[str, Any] | None], None]  # receives events, then None when the turn is over
Queued = Callable[[], None]  # told when a turn has to wait in the admission queue

_STATUS = {"stop": "complete", "length": "complete", "timeout": "stopped", "error": "error"}


@dataclass(slots=True)
class Turn:
    """A reply being generated for one session."""

    session_id: str
    owner: str
    message_id: str
    request_id: str
    title: str
    sink: Sink
    client_id: str | None = None
    ticket: Ticket | None = None  # its admission; released when the generation ends
    task: asyncio.Task | None = None
    cancelled: bool = False
    done: bool = False

    def emit(self, event: dict[str, Any]) -> None:
        if self.client_id is not None:
            event["client_id"] = self.client_id
        try:
            self.sink(event)
        except Exception:  # a consumer's problem must not break the turn
            log.exception("event sink failed for session %s", self.session_id)


@dataclass(slots=True)
class _Plan:
    history: list[dict[str, Any]]  # messages that go to the template, the new user message included
    parent_id: str | None  # the stored message the new one(s) go below
    user_content: str | None = None
    title: str | None = None
    branches: bool = False  # edit/regenerate: a new branch; the client is sent the chosen branch up to the reply


def title_from(content: str) -> str:
    line = re.sub(r"\s+", " ", content.strip().splitlines()[0] if content.strip() else "").strip()
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def _not_found(session_id: str) -> ServiceError:
    return ServiceError("not_found", f"session '{session_id}' not found", param="session_id")


class ChatService:
    """Starts, tracks and cancels chat turns; at most one running turn per session. Every generation (turns
    and /v1 requests) goes through `admission` (app/admission.py): past the engine's capacity it waits in a
    queue fair across owners."""

    def __init__(self, engine: Any, store: Store, metrics: Metrics, admission: Admission | None = None) -> None:
        self.engine = engine
        self.store = store
        self.metrics = metrics
        self.admission = admission if admission is not None else Admission(engine.max_num_seqs)
        metrics.bind_admission(self.admission)
        self.turns: dict[str, Turn] = {}  # session id -> running turn
        self._reserved: set[str] = set()  # sessions whose turn is being set up (or waits to be admitted)
        self._open: dict[str, list[Any]] = {}  # session id -> [title, sockets showing it]
        self.shutting_down = False

    # -- starting turns -------------------------------------------------------------------

    async def send(self, session_id: str, owner: str, content: str, sink: Sink, client_id: str | None = None,
                   idempotency_key: str | None = None,
                   response_format: ResponseFormatField | None = None, queued: Queued | None = None) -> Turn | None:
        """Append a user message and stream a reply (constrained by `response_format`, when given). Raises
        ServiceError before storing anything. Past the engine's capacity this waits to be admitted (`queued` is
        called when it starts waiting); a full queue or a passed deadline raises ServiceError with
        `retry_after_s`.

        A send whose `idempotency_key` the session already holds stores nothing: the sink gets the
        session's `history` (that message and its reply as stored now) and None is returned."""
        if idempotency_key is not None and await self._answered(session_id, owner, idempotency_key, sink, client_id):
            return None
        return await self._begin(session_id, owner, sink, client_id, lambda s, msgs: self._plan_send(s, msgs, content),
                                 idempotency_key, response_format, queued)

    async def edit(self, session_id: str, owner: str, message_id: str, content: str, sink: Sink,
                   client_id: str | None = None, queued: Queued | None = None) -> Turn:
        """A new branch: the user message `message_id` (on the chosen branch) gets a sibling holding
        `content`, and a reply to it streams."""
        return await self._begin(session_id, owner, sink, client_id,
                                 lambda s, msgs: self._plan_edit(msgs, session_id, message_id, content),
                                 queued=queued)

    async def regenerate(self, session_id: str, owner: str, sink: Sink, client_id: str | None = None,
                         queued: Queued | None = None) -> Turn:
        """A new branch: the last reply (if the session ends with one) gets a sibling, streamed anew."""
        return await self._begin(session_id, owner, sink, client_id, lambda s, msgs: self._plan_regenerate(msgs),
                                 queued=queued)

    async def select(self, session_id: str, owner: str, message_id: str
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Choose the branch through `message_id` (any message of the session); returns the session and its
        chosen branch. Refused (busy) while a reply is being generated in the session."""
        if self.running(session_id, owner) is not None or session_id in self._reserved:
            raise ServiceError("busy", f"a reply is being generated in session '{session_id}'; switch branches "
                               "when it is done", param="session_id")
        found = await self.store.select(session_id, owner, message_id)
        if found is not None:
            return found
        if await self.store.get_session(session_id, owner) is None:
            raise _not_found(session_id)
        raise ServiceError("not_found", f"message '{message_id}' not found in session '{session_id}'",
                           param="message_id")

    async def _answered(self, session_id: str, owner: str, key: str, sink: Sink, client_id: str | None) -> bool:
        if not await self.store.sent_with_key(session_id, key):
            return False
        found = await self.store.get_history(session_id, owner)
        if found is None:
            raise _not_found(session_id)
        event: dict[str, Any] = {"type": "history", "session_id": session_id, "messages": found[1]}
        if client_id is not None:
            event["client_id"] = client_id
        sink(event)
        sink(None)
        return True

    def _plan_send(self, session: dict[str, Any], messages: list[dict[str, Any]], content: str) -> _Plan:
        title = None
        if session["title"] == DEFAULT_TITLE and not any(m["role"] == "user" for m in messages):
            title = title_from(content) or None
        return _Plan(history=messages + [{"role": "user", "content": content}],
                     parent_id=messages[-1]["id"] if messages else None, user_content=content, title=title)

    def _plan_edit(self, messages: list[dict[str, Any]], session_id: str, message_id: str, content: str) -> _Plan:
        idx = next((i for i, m in enumerate(messages) if m["id"] == message_id), None)
        if idx is None:
            raise ServiceError("not_found", f"message '{message_id}' not found on the chosen branch of session "
                               f"'{session_id}'", param="message_id")
        target = messages[idx]
        if target["role"] != "user":
            raise ServiceError("invalid_parameter",
                               f"message '{message_id}' is an {target['role']} message; only user messages can be edited",
                               param="message_id")
        return _Plan(history=messages[:idx] + [{"role": "user", "content": content}], parent_id=target["parent_id"],
                     user_content=content, branches=True)

    def _plan_regenerate(self, messages: list[dict[str, Any]]) -> _Plan:
        kept = list(messages)
        if kept and kept[-1]["role"] == "assistant":
            kept.pop()
        if not kept or kept[-1]["role"] != "user":
            raise ServiceError("invalid_parameter", "nothing to regenerate: the session does not end with a user message "
                               "or an assistant reply to one")
        return _Plan(history=kept, parent_id=kept[-1]["id"], branches=True)

    async def _begin(self, session_id: str, owner: str, sink: Sink, client_id: str | None,
                     plan_for: Callable[[dict[str, Any], list[dict[str, Any]]], _Plan],
                     idempotency_key: str | None = None, response_format: ResponseFormatField | None = None,
                     queued: Queued | None = None) -> Turn:
        if self.shutting_down:
            raise ServiceError("unavailable", "the server is shutting down")
        if session_id in self.turns or session_id in self._reserved:
            raise ServiceError("busy", f"a reply is already being generated in session '{session_id}'", param="session_id")
        self._reserved.add(session_id)
        gen: Any = None
        held: Ticket | None = None  # admitted, and no turn owns it yet
        try:
            found = await self.store.get_history(session_id, owner)
            if found is None:
                raise _not_found(session_id)
            before, messages = found
            plan = plan_for(before, messages)
            # Rendering and tokenizing a long conversation takes a while: not on the event loop.
            prompt = await asyncio.to_thread(self._render, before, plan.history)
            params = self._sampling(before["settings"], len(prompt))
            params.response_format = await compile_response_format(self.engine, response_format)
            req = GenerationRequest(prompt_token_ids=prompt, params=params)
            held = await self.admit(owner, params.n, queued)  # nothing is stored before this
            if self.shutting_down:
                raise ServiceError("unavailable", "the server is shutting down")
            gen = self._admit(req)
            started = await self.store.start_reply(session_id, owner, parent_id=plan.parent_id,
                                                   user_content=plan.user_content, idempotency_key=idempotency_key,
                                                   title=plan.title)
            if started is None:
                raise _not_found(session_id)
            session, branch = started
            reply = branch[-1]
            turn = Turn(session_id=session_id, owner=owner, message_id=reply["id"], request_id=req.request_id,
                        title=session["title"], sink=sink, client_id=client_id, ticket=held)
            if plan.branches:
                turn.emit({"type": "history", "session_id": session_id, "messages": branch[:-1]})
            else:
                turn.emit({"type": "message.created", "session_id": session_id, "message": branch[-2]})
            turn.emit({"type": "message.created", "session_id": session_id, "message": reply})
            if plan.title is not None:
                turn.emit({"type": "session", "session": session})
            self.turns[session_id] = turn
            turn.task = asyncio.create_task(self._run(turn, gen, len(prompt)), name=f"turn-{session_id}")
            gen = held = None  # the turn owns them now
            return turn
        except Conflict:
            raise ServiceError("busy", "this idempotency key was just used in the session", param="idempotency_key") \
                from None
        finally:
            self._reserved.discard(session_id)
            if gen is not None:  # admitted, but no turn runs it
                await gen.aclose()
            if held is not None:
                self.release(held)

    def _admit(self, req: GenerationRequest) -> Any:
        """The engine takes the request now or refuses it: nothing is stored for a refused turn."""
        try:
            return self.engine.generate(req)
        except EngineOverloaded as e:
            raise ServiceError("overloaded", f"the server is overloaded: {e}; retry later") from None
        except InvalidRequest as e:
            raise ServiceError("invalid_parameter", f"session setting {e}", param=f"settings.{e.param}") from None

    # -- admission (turns and /v1 requests) ------------------------------------------------

    def enter(self, owner: str, cost: int = 1) -> Ticket:
        """A place for one generation of `cost` sequences: granted at once, or waiting (then `wait`).
        ServiceError("queue_full") when the queue is full."""
        try:
            ticket = self.admission.enter(owner, cost)
        except QueueFull as e:
            raise ServiceError("queue_full", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        if ticket.granted:
            self.metrics.admitted(0.0)
        return ticket

    async def wait(self, ticket: Ticket) -> None:
        """Until `ticket` is admitted; ServiceError("queue_timeout") past the deadline. Cancelled, it leaves
        the queue."""
        if ticket.granted:
            return
        try:
            await self.admission.wait(ticket)
        except QueueTimeout as e:
            raise ServiceError("queue_timeout", f"the server is busy: {e}", retry_after_s=e.retry_after_s) from None
        self.metrics.admitted(ticket.waited_s)

    async def admit(self, owner: str, cost: int = 1, queued: Queued | None = None) -> Ticket:
        """`enter`, then `wait` (telling `queued` first) when it could not be admitted at once."""
        ticket = self.enter(owner, cost)
        if not ticket.granted:
            if queued is not None:
                queued()
            await self.wait(ticket)
        return ticket

    def release(self, ticket: Ticket | None) -> None:
        """The generation ended, or never started: give its place back (or leave the queue)."""
        if ticket is not None:
            self.admission.withdraw(ticket)

    def _render(self, session: dict[str, Any], history: list[dict[str, Any]]) -> list[int]:
        msgs: list[dict[str, str]] = []
        if session.get("system_prompt"):
            msgs.append({"role": "system", "content": session["system_prompt"]})
        for m in history:
            # Replies that failed or never produced text are not part of the conversation; neither is the
            # question they answered (templates may require user/assistant to alternate).
            if m["role"] == "assistant" and (not m["content"] or m.get("status") == "error"):
                if msgs and msgs[-1]["role"] == "user":
                    msgs.pop()
                continue
            msgs.append({"role": m["role"], "content": m["content"]})
        try:
            return list(self.engine.render_chat(msgs, add_generation_prompt=True))
        except ValueError as e:
            raise ServiceError("invalid_parameter", f"the model's chat template refused the conversation: {e}") from None

    def _sampling(self, settings: dict[str, Any], prompt_len: int) -> SamplingParams:
        room = int(self.engine.max_context) - prompt_len
        if room < 1:
            raise ServiceError("invalid_parameter", f"the conversation is {prompt_len} tokens; the model's context is "
                               f"{self.engine.max_context}: start a new session or edit an earlier message",
                               param="content")
        merged = {**session_defaults(self.engine), **settings}
        return SamplingParams(max_tokens=min(int(merged["max_tokens"]), room), temperature=float(merged["temperature"]),
                              top_p=float(merged["top_p"]), **turn_extras(self.engine))

    # -- running a turn -------------------------------------------------------------------

    async def _run(self, turn: Turn, gen: Any, prompt_len: int) -> None:
        parts: list[str] = []
        completion = 0
        final = None
        failure: str | None = None
        killed = False
        tracker = self.metrics.tracker("chat")
        last_save = time.monotonic()
        if self.shutting_down:  # interrupt_all() ran while this turn was being set up
            turn.cancelled = True
            self.engine.abort(turn.request_id)
        try:
            try:
                async for ev in gen:
                    tracker.observe(ev)
                    completion += len(ev.token_ids)
                    if ev.text:
                        parts.append(ev.text)
                        turn.emit({"type": "delta", "session_id": turn.session_id, "message_id": turn.message_id,
                                   "text": ev.text})
                    if ev.finish_reason is not None:
                        final = ev
                        break
                    if time.monotonic() - last_save >= SAVE_INTERVAL_S:
                        last_save = time.monotonic()
                        await self._save_progress(turn, "".join(parts), completion)
            finally:
                await gen.aclose()
        except asyncio.CancelledError:
            killed = True  # only drain() cancels a turn: store what we have, then stop
        except Exception as e:  # e.g. the engine refused it after admission
            log.error("generation failed in session %s: %r", turn.session_id, e)
            failure = "generation failed"
        finally:
            tracker.close()
            self.release(turn.ticket)
        try:
            await self._finish(turn, parts, completion, final, failure, killed, prompt_len)
        except Exception:
            log.exception("could not finish the turn in session %s", turn.session_id)
        finally:
            turn.done = True
            if self.turns.get(turn.session_id) is turn:
                del self.turns[turn.session_id]
            turn.sink(None)
        if killed:
            raise asyncio.CancelledError

    async def _finish(self, turn: Turn, parts: list[str], completion: int, final: Any, failure: str | None,
                      killed: bool, prompt_len: int) -> None:
        ids = {"session_id": turn.session_id, "message_id": turn.message_id}
        reason = final.finish_reason if final is not None else ("abort" if (turn.cancelled or killed) else "error")
        if reason == "abort":
            status = "interrupted" if self.shutting_down else "stopped"
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
        if not await self._store_final(turn, "".join(parts), status, reason, prompt_tokens, cached, completion,
                                       ttft_ms, tps):
            status, failure = "error", failure or "the reply could not be stored"
        self._forget(turn)
        if failure is not None:
            turn.emit(ServiceError("internal", failure).event(**ids))
        turn.emit({"type": "done", **ids, "status": status, "finish_reason": reason,
                   "usage": {"prompt_tokens": prompt_tokens, "cached_tokens": cached, "completion_tokens": completion},
                   "timings": {"ttft_ms": ttft_ms, "total_ms": total_ms, "tokens_per_s": tps}})

    async def _store_final(self, turn: Turn, text: str, status: str, reason: str, prompt_tokens: int,
                           cached: int | None, completion: int, ttft_ms: float | None, tps: float | None) -> bool:
        """The reply's last write, tried twice; if it can't be made, the reply is stored as "error" with a
        smaller write (the client is told so). False when the reply is not stored as `status`."""
        for attempt in range(FINAL_TRIES):
            try:
                await self.store.finish_reply(turn.message_id, content=text, status=status, finish_reason=reason,
                                              prompt_tokens=prompt_tokens, cached_tokens=cached,
                                              completion_tokens=completion, ttft_ms=ttft_ms, tokens_per_s=tps)
                return True
            except Exception:
                log.exception("could not store the reply %s (attempt %d)", turn.message_id, attempt + 1)
                await asyncio.sleep(0.05 * (attempt + 1))
        try:
            await self.store.set_status(turn.message_id, "error", reason)
        except Exception:  # the database is gone: the next start marks the reply "interrupted"
            log.exception("could not mark the reply %s as failed", turn.message_id)
        return False

    async def _save_progress(self, turn: Turn, text: str, completion: int) -> None:
        try:
            await self.store.save_progress(turn.message_id, text, completion)
        except Exception as e:  # a busy database must not end the reply; the final write retries the lot
            log.warning("could not store the progress of reply %s: %s", turn.message_id, e)

    def _forget(self, turn: Turn) -> None:
        # Before the last event goes out, so a client reacting to it finds the session free.
        if self.turns.get(turn.session_id) is turn:
            del self.turns[turn.session_id]

    # -- stopping -------------------------------------------------------------------------

    def running(self, session_id: str, owner: str) -> Turn | None:
        """The running turn of one of `owner`'s sessions."""
        turn = self.turns.get(session_id)
        return turn if turn is not None and turn.owner == owner and not turn.done else None

    def cancel(self, session_id: str, owner: str) -> bool:
        """Abort the running turn of a session (its partial reply is stored as "stopped")."""
        turn = self.running(session_id, owner)
        if turn is None:
            return False
        turn.cancelled = True
        self.engine.abort(turn.request_id)
        return True

    def cancel_turn(self, turn: Turn) -> None:
        """Abort this turn if it is still running (a transport that started it went away)."""
        if not turn.done:
            turn.cancelled = True
            self.engine.abort(turn.request_id)

    async def cancel_and_wait(self, session_id: str, owner: str, timeout: float = 10.0) -> None:
        turn = self.running(session_id, owner)
        if turn is not None and self.cancel(session_id, owner) and turn.task is not None:
            await asyncio.wait({turn.task}, timeout=timeout)

    def interrupt_all(self) -> None:
        """Server shutdown: refuse new turns, abort the running ones (stored as "interrupted")."""
        self.shutting_down = True
        for turn in list(self.turns.values()):
            if not turn.done:
                self.engine.abort(turn.request_id)

    async def drain(self, timeout: float) -> None:
        """Wait for the running turns to store their replies; cancel what is still running after `timeout`."""
        tasks = {t.task for t in self.turns.values() if t.task is not None}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    def opened(self, session_id: str, title: str) -> None:
        """A client (WebSocket) shows this session; see `active`."""
        entry = self._open.setdefault(session_id, [title, 0])
        entry[0] = title
        entry[1] += 1

    def closed(self, session_id: str) -> None:
        entry = self._open.get(session_id)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[session_id]

    def active(self) -> list[dict[str, Any]]:
        """Sessions generating a reply ("generating") or open on a connected client ("open")."""
        out = [{"id": t.session_id, "title": t.title, "status": "generating", "message_id": t.message_id,
                "viewers": self._open.get(t.session_id, [None, 0])[1]} for t in self.turns.values()]
        out += [{"id": sid, "title": title, "status": "open", "message_id": None, "viewers": count}
                for sid, (title, count) in self._open.items() if sid not in self.turns]
        return out
