"""ChatService: starting, tracking and stopping chat turns. A turn stores the user message, renders the whole
conversation and streams the engine's reply, stored as it grows.

Its pieces, one job each: starting a turn (begin.py, over plan.py: which messages, below which; prompt.py: the
prompt and its sampling), running it to its end (run.py), one turn per session (guard.py), the session's changes
between turns (between.py: a branch chosen, a tool's result, deletion), who is looking (presence.py), admission
past the engine's capacity (admit.py over admission.py) and the sessions' MCP tool rounds (mcp/sessions.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.domain.admission import Admission
from app.domain.admit import Admitter
from app.domain.begin import TurnRequest, TurnStarter
from app.domain.between import BetweenTurns
from app.domain.errors import not_found
from app.domain.guard import Guard
from app.domain.mcp.registry import McpRegistry
from app.domain.mcp.rounds import Rounds
from app.domain.mcp.sessions import McpSessions
from app.domain.models import ModelRegistry, ModelSpec
from app.domain.plan import plan_continue, plan_edit, plan_regenerate, plan_send
from app.domain.presence import Presence
from app.domain.relay import Relay
from app.domain.replay import Replay, Replays
from app.domain.run import Runner
from app.domain.turn import Queued, Sink, Turn
from app.metrics import Metrics
from app.store import Store
from app.store.records import MessageRecord, SessionRecord
from engine.types import ResponseFormat

if TYPE_CHECKING:
    from engine import Engine


class ChatService:
    """Starts, tracks and cancels chat turns; at most one running turn per session. Every generation (turns
    and /v1 requests) goes through its model's admitter (`admitter`: the default's): past the engine's capacity
    it waits in a queue fair across owners."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        metrics: Metrics,
        admission: Admission | None = None,
        detached_s: float = 120.0,
        replica: str | None = None,
        holding: Callable[[], bool] | None = None,
        models: ModelRegistry | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        admission = admission if admission is not None else Admission(engine.max_num_seqs)
        self.admitter = Admitter(admission, metrics, store.key_slots, replica)  # the per-key cap across replicas
        self.models = models if models is not None else _only(engine)
        _admitters(self.models, self.admitter, store, metrics, replica)
        # replica None: one process on its database; `holding`: this replica still holds its lock and lease
        self.guard = Guard(store.leases, replica, store.reaper, holding)
        self.presence = Presence()
        self.runner = Runner(store, metrics, self.admitter, self.guard)
        self.replays = Replays()  # the turns' numbered events, for clients that reattach (app/domain/replay.py)
        self.mcp_sessions = McpSessions(store, self.guard)  # the sessions' MCP tools and tool rounds
        self.starter = TurnStarter(
            self.models,
            store,
            self.guard,
            self.runner,
            self.replays,
            self.mcp_sessions,
            self.cancel_turn,
            detached_s,
        )
        self.between = BetweenTurns(store, self.guard, self.cancel_and_wait)  # branch choice, tool results, deletion

    @property
    def admission(self) -> Admission:
        return self.admitter.admission

    @property
    def turns(self) -> dict[str, Turn]:
        """Session id -> its running turn."""
        return self.guard.turns

    @property
    def relay(self) -> Relay | None:
        """With replicas: the turns' events on every replica (app/domain/relay.py)."""
        return self.starter.relay

    @relay.setter
    def relay(self, relay: Relay | None) -> None:
        self.starter.relay = relay

    @property
    def detached_s(self) -> float:
        """A turn nobody watches this long is stopped."""
        return self.starter.detached_s

    @detached_s.setter
    def detached_s(self, seconds: float) -> None:
        self.starter.detached_s = seconds

    @property
    def mcp(self) -> McpRegistry | None:
        """The MCP servers whose tools sessions may choose (settings.mcp_tools)."""
        return self.mcp_sessions.registry

    @mcp.setter
    def mcp(self, registry: McpRegistry | None) -> None:
        self.mcp_sessions.registry = registry

    @property
    def mcp_rounds(self) -> int:
        """The tool rounds one message runs by itself (app/domain/mcp/rounds.py)."""
        return self.mcp_sessions.limit

    @mcp_rounds.setter
    def mcp_rounds(self, limit: int) -> None:
        self.mcp_sessions.limit = limit

    @property
    def rounds(self) -> dict[str, Rounds]:
        """Session id -> its message's tool rounds, while they last."""
        return self.mcp_sessions.rounds

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
        return await self.starter.start(
            TurnRequest(
                session_id,
                owner,
                sink,
                lambda s, msgs: plan_send(s, msgs, content),
                client_id,
                idempotency_key,
                response_format,
                queued,
                tools,
            )
        )

    async def resume(
        self, session_id: str, owner: str, sink: Sink, client_id: str | None = None, queued: Queued | None = None
    ) -> Turn:
        """A reply continuing the conversation after the results of every call of its last reply."""
        plan_for = lambda s, msgs: plan_continue(msgs)
        return await self.starter.start(TurnRequest(session_id, owner, sink, plan_for, client_id, queued=queued))

    async def tool_result(
        self, session_id: str, owner: str, tool_call_id: str, content: str
    ) -> tuple[SessionRecord, MessageRecord]:
        """Store a result of the last reply's call (app/domain/between.py); returns the session and the message."""
        return await self.between.tool_result(session_id, owner, tool_call_id, content)

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
        plan_for = lambda s, msgs: plan_edit(msgs, session_id, message_id, content)
        return await self.starter.start(TurnRequest(session_id, owner, sink, plan_for, client_id, queued=queued))

    async def regenerate(
        self, session_id: str, owner: str, sink: Sink, client_id: str | None = None, queued: Queued | None = None
    ) -> Turn:
        """A new branch: the last reply (if the session ends with one) gets a sibling, streamed anew."""
        plan_for = lambda s, msgs: plan_regenerate(msgs)
        return await self.starter.start(TurnRequest(session_id, owner, sink, plan_for, client_id, queued=queued))

    async def select(self, session_id: str, owner: str, message_id: str) -> tuple[SessionRecord, list[MessageRecord]]:
        """Choose the branch through `message_id` (app/domain/between.py); returns the session and that branch."""
        return await self.between.select(session_id, owner, message_id)

    async def _answered(self, session_id: str, owner: str, key: str, sink: Sink, client_id: str | None) -> bool:
        if not await self.store.sent_with_key(session_id, key):
            return False
        found = await self.store.get_history(session_id, owner)
        if found is None:
            raise not_found(session_id)
        event: dict[str, Any] = {
            "type": "history",
            "session_id": session_id,
            "messages": [m.to_dict() for m in found[1]],
        }
        if client_id is not None:
            event["client_id"] = client_id
        sink(event)
        sink(None)
        return True

    def asking(self, session_id: str, owner: str, sink: Sink) -> dict[str, Any] | None:
        """The `tool.approval` event of the MCP call in `session_id` awaiting the user's decision, if any; the
        rounds' events go to `sink` from now on (app/domain/mcp/sessions.py)."""
        return self.mcp_sessions.asking(session_id, owner, sink)

    async def approve(self, session_id: str, owner: str, call_id: str, decision: str) -> SessionRecord | None:
        """The user's decision on the MCP call awaiting approval; "always" also stores the tool in the session's
        `mcp_allowed` and returns the session. ServiceError when no such call waits."""
        return await self.mcp_sessions.approve(session_id, owner, call_id, decision)

    # -- watching ---------------------------------------------------------------------------

    def replay(self, session_id: str, owner: str, message_id: str | None = None) -> Replay | None:
        """The event log of the session's running turn, or of its last one while it is kept after its end (of
        reply `message_id`, when given)."""
        if message_id is not None:
            return self.replays.of_message(session_id, message_id, owner)
        return self.replays.of_session(session_id, owner)

    def detach(self, turn: Turn, sink: Sink) -> None:
        """`sink`'s client went away: the turn goes on (stopped once nobody has watched it for `detached_s`)."""
        sink = self.mcp_sessions.watcher(turn.session_id, sink)  # the rounds around `sink`, when they watch
        if turn.replay is not None:
            turn.replay.detach(sink)
        else:
            self.cancel_turn(turn)

    # -- stopping -------------------------------------------------------------------------

    def running(self, session_id: str, owner: str) -> Turn | None:
        """The running turn of one of `owner`'s sessions."""
        return self.guard.running(session_id, owner)

    def cancel(self, session_id: str, owner: str) -> bool:
        """Abort the running turn of a session (its partial reply is stored as "stopped"), or its running MCP
        tool call (its result says it was stopped, and the reply does not continue)."""
        turn = self.guard.running(session_id, owner)
        if turn is None:
            return self.mcp_sessions.stop(session_id, owner)
        turn.cancelled = True
        turn.abort()
        return True

    def cancel_turn(self, turn: Turn) -> None:
        """Abort this turn if it is still running (a transport that started it went away)."""
        if not turn.done:
            turn.cancelled = True
            turn.abort()

    async def cancel_and_wait(self, session_id: str, owner: str, timeout: float = 10.0) -> None:
        turn = self.guard.running(session_id, owner)
        if turn is not None and self.cancel(session_id, owner) and turn.task is not None:
            await asyncio.wait({turn.task}, timeout=timeout)
        task = self.mcp_sessions.task(session_id)
        if turn is None and task is not None and self.cancel(session_id, owner):
            await asyncio.wait({task}, timeout=timeout)  # an MCP call running or awaiting approval

    async def delete_session(self, session_id: str, owner: str) -> bool:
        """Delete a session, its running reply stopped first (app/domain/between.py); False: not found."""
        return await self.between.delete_session(session_id, owner)

    def interrupt_all(self) -> None:
        """Server shutdown: refuse new turns, abort the running ones (stored as "interrupted")."""
        self.guard.shutting_down = True
        self.mcp_sessions.stop_all()
        for turn in list(self.guard.turns.values()):
            if not turn.done:
                turn.abort()

    def abandon(self) -> None:
        """This replica lost its lock or lease (another may take its sessions): abort the running turns, stored
        as "interrupted" where the reply is still theirs."""
        for turn in list(self.guard.turns.values()):
            turn.fenced = True
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


def _admitters(models: ModelRegistry, default: Admitter, store: Store, metrics: Metrics, replica: str | None) -> None:
    """Each model its own admission queue, sized as the default's: one model's queue never holds up another's
    (each engine schedules its own steps). The metrics read every model's engine and queue; the admin page's
    queue figures are the default's."""
    adm = default.admission
    for slot in models.slots:
        if slot is models.default:
            slot.admitter = default
        elif slot.admitter is None:
            own = Admission(adm.capacity, adm.queue_size, adm.timeout_s, adm.per_owner)
            slot.admitter = Admitter(own, metrics, store.key_slots, replica)
    metrics.admission = adm
    metrics.engines, metrics.admissions, metrics.models = models.engines, models.admissions, models.snapshot


def _only(engine: Engine) -> ModelRegistry:
    """One model, already loaded (a caller's engine, which stays the caller's to shut down)."""
    models = ModelRegistry.of([ModelSpec("default", "default", named=False)], _no_load, lambda _: 0, budget=0)
    models.adopt(models.default, engine, owned=False)
    return models


def _no_load(spec: ModelSpec, progress: Callable[[str], None]) -> Engine:
    raise AssertionError("a one-model service never loads")  # its one model is loaded and stays
