"""ChatService: starting, tracking and stopping chat turns. A turn stores the user message, renders the whole
conversation and streams the engine's reply, stored as it grows.

Its pieces, one job each: planning a turn (plan.py: which messages, below which; prompt.py: the prompt and its
sampling), running it to its end (run.py), one turn per session (guard.py), who is looking (presence.py) and
admission past the engine's capacity (admit.py over admission.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from app.domain.admission import Admission
from app.domain.admit import Admitter, Held
from app.domain.errors import ServiceError, not_found
from app.domain.guard import Guard
from app.domain.plan import Plan, plan_continue, plan_edit, plan_regenerate, plan_send
from app.domain.presence import Presence
from app.domain.prompt import render, sampling
from app.domain.replay import Replay, Replays
from app.domain.response_format import compile_response_format
from app.domain.run import Runner
from app.domain.tools import TOOL_KEYS, ToolPlan, check_result
from app.domain.tools import plan as plan_tools
from app.domain.turn import Queued, Sink, Turn
from app.metrics import Metrics
from app.store import Conflict, Store
from app.store.leases import Lease
from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, ResponseFormat

if TYPE_CHECKING:
    from engine import Engine
    from engine.engine import RequestStream

Planner = Callable[[dict[str, Any], list[dict[str, Any]]], Plan]  # (session, chosen branch) -> the turn's plan


class ChatService:
    """Starts, tracks and cancels chat turns; at most one running turn per session. Every generation (turns
    and /v1 requests) goes through `admitter`: past the engine's capacity it waits in a queue fair across
    owners."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        metrics: Metrics,
        admission: Admission | None = None,
        detached_s: float = 120.0,
        replica: str | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.metrics = metrics
        admission = admission if admission is not None else Admission(engine.max_num_seqs)
        self.admitter = Admitter(admission, metrics, store.key_slots, replica)  # the per-key cap across replicas
        self.guard = Guard(store.leases, replica)  # replica None: one process on its database
        self.presence = Presence()
        self.runner = Runner(engine, store, metrics, self.admitter, self.guard)
        self.replays = Replays()  # the turns' numbered events, for clients that reattach (app/domain/replay.py)
        self.detached_s = detached_s  # a turn nobody watches this long is stopped
        # /v1 requests take their places here too (app/api/openai.py)
        self.enter, self.wait, self.release = self.admitter.enter, self.admitter.wait, self.admitter.release

    @property
    def admission(self) -> Admission:
        return self.admitter.admission

    @property
    def turns(self) -> dict[str, Turn]:
        """Session id -> its running turn."""
        return self.guard.turns

    # -- starting turns -------------------------------------------------------------------

    async def send(
        self,
        session_id: str,
        owner: str,
        content: str,
        sink: Sink,
        client_id: str | None = None,
        idempotency_key: str | None = None,
        response_format: ResponseFormat | None = None,
        queued: Queued | None = None,
        tools: dict[str, Any] | None = None,
    ) -> Turn | None:
        """Append a user message and stream a reply (constrained by `response_format`, when given; `tools`: this
        message's `tools` / `tool_choice` / `parallel_tool_calls`, over the session's settings). Raises
        ServiceError before storing anything. Past the engine's capacity this waits to be admitted (`queued` is
        called when it starts waiting); a full queue or a passed deadline raises ServiceError with
        `retry_after_s`.

        A send whose `idempotency_key` the session already holds stores nothing: the sink gets the
        session's `history` (that message and its reply as stored now) and None is returned."""
        if idempotency_key is not None and await self._answered(session_id, owner, idempotency_key, sink, client_id):
            return None
        return await self._begin(
            session_id,
            owner,
            sink,
            client_id,
            lambda s, msgs: plan_send(s, msgs, content),
            idempotency_key,
            response_format,
            queued,
            tools,
        )

    async def resume(
        self, session_id: str, owner: str, sink: Sink, client_id: str | None = None, queued: Queued | None = None
    ) -> Turn:
        """A reply continuing the conversation after the results of every call of its last reply."""
        return await self._begin(session_id, owner, sink, client_id, lambda s, msgs: plan_continue(msgs), queued=queued)

    async def tool_result(
        self, session_id: str, owner: str, tool_call_id: str, content: str
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Store the result of a call of the chosen branch's last reply (a `tool` message below it and the
        results before); returns the session and the message. Refused while a reply is being generated."""
        with self.guard.reserve(session_id):
            found = await self.store.get_history(session_id, owner)
            if found is None:
                raise not_found(session_id)
            _, branch = found
            check_result(branch, tool_call_id)
            added = await self.store.add_tool_result(
                session_id, owner, parent_id=branch[-1]["id"], tool_call_id=tool_call_id, content=content
            )
            if added is None:
                raise not_found(session_id)
            return added

    async def edit(
        self,
        session_id: str,
        owner: str,
        message_id: str,
        content: str,
        sink: Sink,
        client_id: str | None = None,
        queued: Queued | None = None,
    ) -> Turn:
        """A new branch: the user message `message_id` (on the chosen branch) gets a sibling holding
        `content`, and a reply to it streams."""
        return await self._begin(
            session_id,
            owner,
            sink,
            client_id,
            lambda s, msgs: plan_edit(msgs, session_id, message_id, content),
            queued=queued,
        )

    async def regenerate(
        self, session_id: str, owner: str, sink: Sink, client_id: str | None = None, queued: Queued | None = None
    ) -> Turn:
        """A new branch: the last reply (if the session ends with one) gets a sibling, streamed anew."""
        return await self._begin(
            session_id, owner, sink, client_id, lambda s, msgs: plan_regenerate(msgs), queued=queued
        )

    async def select(self, session_id: str, owner: str, message_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Choose the branch through `message_id` (any message of the session); returns the session and its
        chosen branch. Refused (busy) while a reply is being generated in the session, on any replica."""
        busy = ServiceError(
            "busy",
            f"a reply is being generated in session '{session_id}'; switch branches when it is done",
            param="session_id",
        )
        if self.guard.running(session_id, owner) is not None or session_id in self.guard.reserved:
            raise busy
        async with self._between_turns(session_id, owner, busy):
            found = await self.store.select(session_id, owner, message_id)
        if found is not None:
            return found
        if await self.store.get_session(session_id, owner) is None:
            raise not_found(session_id)
        raise ServiceError(
            "not_found", f"message '{message_id}' not found in session '{session_id}'", param="message_id"
        )

    async def _answered(self, session_id: str, owner: str, key: str, sink: Sink, client_id: str | None) -> bool:
        if not await self.store.sent_with_key(session_id, key):
            return False
        found = await self.store.get_history(session_id, owner)
        if found is None:
            raise not_found(session_id)
        event: dict[str, Any] = {"type": "history", "session_id": session_id, "messages": found[1]}
        if client_id is not None:
            event["client_id"] = client_id
        sink(event)
        sink(None)
        return True

    async def _begin(
        self,
        session_id: str,
        owner: str,
        sink: Sink,
        client_id: str | None,
        plan_for: Planner,
        idempotency_key: str | None = None,
        response_format: ResponseFormat | None = None,
        queued: Queued | None = None,
        tools: dict[str, Any] | None = None,
    ) -> Turn:
        gen: RequestStream | None = None
        held: Held | None = None  # admitted, and no turn owns it yet
        lease: Lease | None = None  # the session's lease in the store, no turn owns it yet
        try:
            with self.guard.reserve(session_id):
                lease = await self.guard.take(session_id)
                found = await self.store.get_history(session_id, owner)
                if found is None:
                    raise not_found(session_id)
                before, messages = found
                plan = plan_for(before, messages)
                tool_plan = await self._tools(before["settings"], tools or {}, response_format is not None)
                # Rendering and tokenizing a long conversation takes a while: not on the event loop.
                prompt = await asyncio.to_thread(
                    render, self.engine, before, plan.history, tool_plan.render if tool_plan else None
                )
                params = sampling(self.engine, before["settings"], len(prompt))
                params.response_format = await compile_response_format(self.engine, response_format)
                if tool_plan is not None and tool_plan.grammar is not None:
                    params.response_format = tool_plan.grammar
                req = GenerationRequest(prompt_token_ids=prompt, params=params)
                held = await self.admitter.admit(owner, params.n, queued)  # nothing is stored before this
                self.guard.check_open()
                gen = self._generate(req)
                started = await self.store.start_reply(
                    session_id,
                    owner,
                    parent_id=plan.parent_id,
                    user_content=plan.user_content,
                    idempotency_key=idempotency_key,
                    title=plan.title,
                    replica=self.guard.replica,
                )
                if started is None:
                    raise not_found(session_id)
                session, branch = started
                reply = branch[-1]
                # The turn's events go to a numbered log that `sink` watches (with `client_id` on them), and so
                # may other clients: the reply goes on while someone watches or reattaches (app/domain/replay.py).
                replay = Replay(session_id, owner, reply["id"], self.detached_s)
                replay.attach(sink, 0, client_id)
                turn = Turn(
                    session_id=session_id,
                    owner=owner,
                    message_id=reply["id"],
                    request_id=req.request_id,
                    title=session["title"],
                    sink=replay.publish,
                    ticket=held,
                    replay=replay,
                    lease=lease,
                    tool_format=tool_plan.fmt if tool_plan else None,
                )
                replay.on_idle = lambda: self.cancel_turn(turn)
                replay.on_end = lambda: self.replays.ended(replay)
                self.replays.add(replay)
                if plan.branches:
                    turn.emit({"type": "history", "session_id": session_id, "messages": branch[:-1]})
                elif plan.user_content is not None:
                    turn.emit({"type": "message.created", "session_id": session_id, "message": branch[-2]})
                turn.emit({"type": "message.created", "session_id": session_id, "message": reply})
                if plan.title is not None:
                    turn.emit({"type": "session", "session": session})
                self.guard.turns[session_id] = turn
                turn.task = asyncio.create_task(self.runner.run(turn, gen, len(prompt)), name=f"turn-{session_id}")
                gen = held = lease = None  # the turn owns them now
                return turn
        except Conflict:
            raise ServiceError(
                "busy", "this idempotency key was just used in the session", param="idempotency_key"
            ) from None
        finally:
            if gen is not None:  # admitted, but no turn runs it
                await gen.aclose()
            if held is not None:
                self.admitter.release(held)
            await self.guard.give_back(lease)

    async def _tools(self, settings: dict[str, Any], given: dict[str, Any], response_format: bool) -> ToolPlan | None:
        """The turn's tools: the message's own (`given`) over the session's settings; the session's tool_choice
        and parallel_tool_calls count only beside tools. Errors name the message's field or `settings.<field>`."""
        if "tools" in given:
            tools, prefix = given["tools"], ""
        else:  # a tool_choice given without any tools is the message's fault
            tools = settings.get("tools")
            prefix = "settings." if tools is not None else ""
        kept = {k: settings.get(k) for k in TOOL_KEYS[1:]} if tools is not None else {}
        options = {**kept, **{k: v for k, v in given.items() if k != "tools"}}
        return await plan_tools(
            self.engine,
            tools,
            options.get("tool_choice"),
            options.get("parallel_tool_calls"),
            response_format=response_format,
            prefix=prefix,
        )

    def _generate(self, req: GenerationRequest) -> RequestStream:
        """The engine takes the request now or refuses it: nothing is stored for a refused turn."""
        try:
            return self.engine.generate(req)
        except EngineOverloaded as e:
            raise ServiceError("overloaded", f"the server is overloaded: {e}; retry later") from None
        except InvalidRequest as e:
            raise ServiceError("invalid_parameter", f"session setting {e}", param=f"settings.{e.param}") from None

    def _render(self, session: dict[str, Any], history: list[dict[str, Any]]) -> list[int]:
        return render(self.engine, session, history)

    # -- watching ---------------------------------------------------------------------------

    def replay(self, session_id: str, owner: str, message_id: str | None = None) -> Replay | None:
        """The event log of the session's running turn, or of its last one while it is kept after its end (of
        reply `message_id`, when given)."""
        if message_id is not None:
            return self.replays.of_message(session_id, message_id, owner)
        return self.replays.of_session(session_id, owner)

    def detach(self, turn: Turn, sink: Sink) -> None:
        """`sink`'s client went away: the turn goes on (stopped once nobody has watched it for `detached_s`)."""
        if turn.replay is not None:
            turn.replay.detach(sink)
        else:
            self.cancel_turn(turn)

    # -- stopping -------------------------------------------------------------------------

    def running(self, session_id: str, owner: str) -> Turn | None:
        """The running turn of one of `owner`'s sessions."""
        return self.guard.running(session_id, owner)

    def cancel(self, session_id: str, owner: str) -> bool:
        """Abort the running turn of a session (its partial reply is stored as "stopped")."""
        turn = self.guard.running(session_id, owner)
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
        turn = self.guard.running(session_id, owner)
        if turn is not None and self.cancel(session_id, owner) and turn.task is not None:
            await asyncio.wait({turn.task}, timeout=timeout)

    async def delete_session(self, session_id: str, owner: str) -> bool:
        """Delete a session (False: not found); a reply running here is stopped first, one running on another
        replica refuses (busy) as a concurrent turn would."""
        await self.cancel_and_wait(session_id, owner)
        busy = ServiceError(
            "busy", f"a reply is being generated in session '{session_id}' on another replica", param="session_id"
        )
        async with self._between_turns(session_id, owner, busy):
            return await self.store.delete_session(session_id, owner)

    @asynccontextmanager
    async def _between_turns(self, session_id: str, owner: str, busy: ServiceError) -> AsyncIterator[None]:
        """Hold the session's lease (with replicas) so no turn starts on any replica meanwhile; `busy` while one
        runs. Another owner's session is not found, busy or not."""
        try:
            lease = await self.guard.take(session_id)
        except ServiceError:
            if await self.store.get_session(session_id, owner) is None:
                raise not_found(session_id) from None
            raise busy from None
        try:
            yield
        finally:
            await self.guard.give_back(lease)

    def interrupt_all(self) -> None:
        """Server shutdown: refuse new turns, abort the running ones (stored as "interrupted")."""
        self.guard.shutting_down = True
        for turn in list(self.guard.turns.values()):
            if not turn.done:
                self.engine.abort(turn.request_id)

    def abandon(self) -> None:
        """This replica lost its lease (another may have taken its sessions): abort the running turns."""
        for turn in list(self.guard.turns.values()):
            self.cancel_turn(turn)

    async def drain(self, timeout: float) -> None:
        """Wait for the running turns to store their replies; cancel what is still running after `timeout`."""
        tasks = {t.task for t in self.guard.turns.values() if t.task is not None}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    async def close(self) -> None:
        """After `drain`: stop the background writes (the replies' progress)."""
        await self.runner.progress.close()

    def active(self) -> list[dict[str, Any]]:
        """Sessions generating a reply ("generating") or open on a connected client ("open")."""
        return self.presence.active(self.guard.turns.values())
