"""Starting one turn: a `TurnRequest` (whose session, what to plan, where its events go) becomes a running Turn.

`TurnStarter.start` does it in order: reserve the session and take its lease, plan (plan.py), choose the tools
(tools.py, with the session's MCP tools), render the prompt and its sampling (prompt.py), admit it past the
engine's capacity (admit.py), hand it to the engine, store the user message and the empty reply, and only then
start the Turn with its replay log (replay.py). Anything refused before the store is written stores nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.domain.admit import Held
from app.domain.errors import ServiceError, not_found
from app.domain.guard import Guard
from app.domain.mcp.rounds import Rounds
from app.domain.mcp.sessions import McpSessions
from app.domain.models import ModelLease, ModelRegistry
from app.domain.plan import Plan, plan_continue
from app.domain.prompt import render, sampling
from app.domain.relay import Relay
from app.domain.replay import Replay, Replays
from app.domain.response_format import compile_response_format
from app.domain.run import Runner
from app.domain.tools import TOOL_KEYS, ToolPlan
from app.domain.tools import plan as plan_tools
from app.domain.turn import Queued, Sink, Turn
from app.store import Conflict, Store
from app.store.leases import Lease
from app.store.records import MessageRecord, SessionRecord
from engine.types import EngineOverloaded, GenerationRequest, InvalidRequest, ResponseFormat

if TYPE_CHECKING:
    from engine import Engine
    from engine.engine import RequestStream

Planner = Callable[[SessionRecord, list[MessageRecord]], Plan]  # (session, chosen branch) -> the turn's plan


@dataclass(slots=True)
class TurnRequest:
    """One turn to start in `session_id`: `plan_for` says which messages it stores and answers; its events go to
    `sink` (tagged with `client_id`). `idempotency_key`: the user message's, stored with it; `response_format`
    constrains the reply; `tools`: the message's own `tools` / `tool_choice` / `parallel_tool_calls`, over the
    session's settings; `queued` is called when the turn starts waiting for admission."""

    session_id: str
    owner: str
    sink: Sink
    plan_for: Planner
    client_id: str | None = None
    idempotency_key: str | None = None
    response_format: ResponseFormat | None = None
    queued: Queued | None = None
    tools: dict[str, Any] | None = None


@dataclass(slots=True)
class _Prepared:
    """A planned turn, before admission: what to store, what to generate, and its tools."""

    session: SessionRecord  # as it was before the turn
    plan: Plan
    prompt: list[int]
    req: GenerationRequest
    tool_plan: ToolPlan | None
    mcp: list[dict[str, Any]]  # the session's MCP tools offered to the turn
    model: ModelLease  # the session's model, held until the turn ends

    @property
    def engine(self) -> Engine:
        return self.model.engine


@dataclass(slots=True, eq=False)
class TurnStarter:
    """Starts turns (one running per session, through `guard`) on their session's model (`models`: each has its
    own engine and admission queue); `cancel_turn` stops one nobody watches for `detached_s`; `relay` (with
    replicas) carries its events to every replica."""

    models: ModelRegistry
    store: Store
    guard: Guard
    runner: Runner
    replays: Replays
    mcp: McpSessions
    cancel_turn: Callable[[Turn], None]
    detached_s: float
    relay: Relay | None = None

    async def start(self, r: TurnRequest) -> Turn:
        """The running turn of `r`. Raises ServiceError before storing anything; past the engine's capacity this
        waits to be admitted, and a full queue or a passed deadline raises ServiceError with `retry_after_s`."""
        gen: RequestStream | None = None
        held: Held | None = None  # admitted, and no turn owns it yet
        lease: Lease | None = None  # the session's lease in the store, no turn owns it yet
        model: ModelLease | None = None  # the session's model, no turn holds it yet
        try:
            with self.guard.reserve(r.session_id):
                lease = await self.guard.take(r.session_id)
                p = await self._prepare(r)
                model = p.model
                # nothing is stored before this
                held = await model.slot.admitter.admit(r.owner, p.req.params.n, r.queued)
                self.guard.check_open()
                gen = self._generate(p.engine, p.req)
                started = await self.store.start_reply(
                    r.session_id,
                    r.owner,
                    parent_id=p.plan.parent_id,
                    user_content=p.plan.user_content,
                    idempotency_key=r.idempotency_key,
                    title=p.plan.title,
                    replica=self.guard.replica,
                )
                if started is None:
                    raise not_found(r.session_id)
                turn = self._turn(r, p, *started, held, lease)
                turn.task = asyncio.create_task(self.runner.run(turn, gen, len(p.prompt)), name=f"turn-{r.session_id}")
                gen = held = lease = model = None  # the turn owns them now
                return turn
        except Conflict:
            raise ServiceError(
                "busy", "this idempotency key was just used in the session", param="idempotency_key"
            ) from None
        finally:
            if gen is not None:  # admitted, but no turn runs it
                await gen.aclose()
            if held is not None and model is not None:
                model.slot.admitter.release(held)
            if model is not None:
                model.release()
            await self.guard.give_back(lease)

    async def _prepare(self, r: TurnRequest) -> _Prepared:
        """Plan the turn on the session as stored now: its messages, tools, prompt and sampling."""
        found = await self.store.get_history(r.session_id, r.owner)
        if found is None:
            raise not_found(r.session_id)
        before, messages = found
        plan = r.plan_for(before, messages)
        # loaded first when it is not; one this server no longer serves is the session's setting at fault
        model = await self.models.acquire(self.models.session_model(before.model))
        try:
            engine = model.engine
            settings = before.settings
            mcp = self.mcp.tools(settings)
            tool_plan = await self._tools(engine, settings, r.tools or {}, r.response_format is not None, mcp)
            # Rendering and tokenizing a long conversation takes a while: not on the event loop.
            prompt = await asyncio.to_thread(
                render, engine, before, plan.history, tool_plan.render if tool_plan else None, plan.user_content
            )
            params = sampling(engine, settings, len(prompt))
            params.response_format = await compile_response_format(engine, r.response_format)
            if tool_plan is not None:
                tool_plan.constrain(params)
        except BaseException:
            model.release()
            raise
        req = GenerationRequest(prompt_token_ids=prompt, params=params)
        return _Prepared(before, plan, prompt, req, tool_plan, mcp, model)

    def _turn(
        self,
        r: TurnRequest,
        p: _Prepared,
        session: SessionRecord,
        branch: list[MessageRecord],
        held: Held,
        lease: Lease | None,
    ) -> Turn:
        """The Turn of the stored reply (`branch[-1]`), its replay log watched by the request's sink, and the
        first events: the messages it stored."""
        reply = branch[-1]
        # The turn's events go to a numbered log that the sink watches (with `client_id` on them), and so may
        # other clients: the reply goes on while someone watches or reattaches (app/domain/replay.py).
        replay = Replay(r.session_id, r.owner, reply.id, self.detached_s)
        if self.relay is not None:
            self.relay.tap(replay)
        replay.attach(self._sink(r, p), 0, r.client_id)
        tool_plan = p.tool_plan
        turn = Turn(
            session_id=r.session_id,
            owner=r.owner,
            message_id=reply.id,
            request_id=p.req.request_id,
            title=session.title,
            sink=replay.publish,
            ticket=held,
            replay=replay,
            lease=lease,
            tool_format=tool_plan.fmt if tool_plan else None,
            model=p.model,
        )
        replay.on_idle = lambda: self.cancel_turn(turn)
        replay.on_end = lambda: self.replays.ended(replay)
        self.replays.add(replay)
        if p.plan.branches:
            turn.emit({"type": "history", "session_id": r.session_id, "messages": [m.to_dict() for m in branch[:-1]]})
        elif p.plan.user_content is not None:
            turn.emit({"type": "message.created", "session_id": r.session_id, "message": branch[-2].to_dict()})
        turn.emit({"type": "message.created", "session_id": r.session_id, "message": reply.to_dict()})
        if p.plan.title is not None:
            turn.emit({"type": "session", "session": session.to_dict()})
        self.guard.turns[r.session_id] = turn
        return turn

    def _sink(self, r: TurnRequest, p: _Prepared) -> Sink:
        """The request's sink, or, when the reply may call the session's MCP tools, the rounds around it that run
        them and continue the reply (app/domain/mcp/rounds.py); a continuing turn's sink is those rounds already."""
        if not p.mcp or p.tool_plan is None or p.tool_plan.render is None or isinstance(r.sink, Rounds):
            return r.sink
        names = {t["function"]["name"] for t in p.mcp}

        def go_on(rounds: Rounds) -> Any:
            return self.start(TurnRequest(r.session_id, r.owner, rounds, _continue, client_id=rounds.client_id))

        return self.mcp.wrap(r.session_id, r.owner, r.sink, r.client_id, names, p.session.settings, go_on)

    async def _tools(
        self,
        engine: Engine,
        settings: dict[str, Any],
        given: dict[str, Any],
        response_format: bool,
        mcp: list[dict[str, Any]] | None = None,
    ) -> ToolPlan | None:
        """The turn's tools: the message's own (`given`) over the session's settings, then the session's MCP tools
        (`mcp`); the session's tool_choice and parallel_tool_calls count only beside tools. Errors name the
        message's field or `settings.<field>`."""
        if "tools" in given:
            tools, prefix = given["tools"], ""
        else:  # a tool_choice given without any tools is the message's fault
            tools = settings.get("tools")
            prefix = "settings." if tools is not None else ""
        if mcp:
            tools, prefix = [*(tools or []), *mcp], prefix or "settings."
        kept = {k: settings.get(k) for k in TOOL_KEYS[1:]} if tools is not None else {}
        options = {**kept, **{k: v for k, v in given.items() if k != "tools"}}
        return await plan_tools(
            engine,
            tools,
            options.get("tool_choice"),
            options.get("parallel_tool_calls"),
            response_format=response_format,
            prefix=prefix,
        )

    def _generate(self, engine: Engine, req: GenerationRequest) -> RequestStream:
        """The engine takes the request now or refuses it: nothing is stored for a refused turn."""
        try:
            return engine.generate(req)
        except EngineOverloaded as e:
            raise ServiceError("overloaded", f"the server is overloaded: {e}; retry later") from None
        except InvalidRequest as e:
            raise ServiceError("invalid_parameter", f"session setting {e}", param=f"settings.{e.param}") from None


def _continue(session: SessionRecord, messages: list[MessageRecord]) -> Plan:
    """A reply continuing the conversation after its last reply's call results."""
    return plan_continue(messages)
