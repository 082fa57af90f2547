"""The served models (app/domain/models.py) on fake engines: names, loading on demand, LRU unloading within the
budget, never a model with a lease, the wait for a busy one and its refusal past the deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.domain.errors import ServiceError
from app.domain.models import ModelRegistry, ModelSpec, parse_specs


class FakeEngine:
    def __init__(self, name: str) -> None:
        self.model_info = {"name": name, "backend": "fake"}
        self.shut = False

    async def shutdown(self) -> None:
        self.shut = True

    def stats(self) -> dict[str, Any]:
        return {"decode_tok_s": 0.0, "kv_usage": 0.0}


def registry(budget: int, wait_s: float = 5.0, **sizes: int) -> tuple[ModelRegistry, list[str]]:
    loads: list[str] = []

    def load(spec: ModelSpec, progress: Any) -> Any:
        progress(f"loading {spec.alias}")
        loads.append(spec.alias)
        return FakeEngine(f"{spec.alias}-model")

    specs = [ModelSpec(name, f"/{name}.gguf") for name in sizes]
    return ModelRegistry.of(specs, load, lambda s: sizes[s.alias], budget, wait_s=wait_s), loads


def test_specs_parse_names_stems_and_refuse_twins() -> None:
    assert parse_specs([]) == [ModelSpec("default", "default", named=False)]
    got = parse_specs(["llama=hf:owner/Repo-GGUF:Q4_K_M", "./models/tiny.Q8_0.gguf", "hf:o/r/f-q4.gguf"])
    assert [(s.alias, s.named) for s in got] == [("llama", True), ("tiny.Q8_0", True), ("f-q4", True)]
    assert parse_specs(["x=/a=b.gguf"])[0].source == "/a=b.gguf"
    assert parse_specs([], fallback="/m/x.gguf") == [ModelSpec("x", "/m/x.gguf")]
    with pytest.raises(ValueError, match="share the name 'a'"):
        parse_specs(["a=/x.gguf", "a=/y.gguf"])
    with pytest.raises(ValueError, match="names no model"):
        parse_specs(["a="])


async def test_unknown_model_is_named_and_default_answers_to_its_names() -> None:
    models, _ = registry(100, first=10, second=10)
    await models.acquire(None)
    assert models.find("default") is models.find("first") is models.find("first-model") is models.default
    named = ModelRegistry.of([ModelSpec("a", "/a.gguf"), ModelSpec("default", "/d.gguf")], None, lambda s: 0, 1)
    assert named.find("default").alias == "default" and named.find(None).alias == "a"  # a given name wins
    with pytest.raises(ServiceError) as e:
        models.find("gpt-4o")
    assert e.value.code == "model_not_found" and e.value.message.startswith("model 'gpt-4o' not found")


async def test_loads_on_demand_and_unloads_the_least_recently_used_idle_model() -> None:
    models, loads = registry(100, main=40, a=30, b=30, c=30)
    (await models.acquire("main")).release()
    (await models.acquire("a")).release()
    (await models.acquire("b")).release()  # 100: full
    assert loads == ["main", "a", "b"] and models.used() == 100
    (await models.acquire("a")).release()  # a used again: main (the default) is now the least recently used
    main_engine = models.default.engine
    (await models.acquire("c")).release()  # c needs 30: main goes, the default like any other
    assert [s.state for s in models.slots] == ["on disk", "ready", "ready", "ready"] and loads[-1] == "c"
    assert main_engine is not None and main_engine.shut and models.default.engine is None
    b_engine = models.find("b").engine
    (await models.acquire(None)).release()  # the default's next request loads it again, in b's room (LRU now)
    assert [s.state for s in models.slots] == ["ready", "ready", "on disk", "ready"] and loads[-1] == "main"
    assert b_engine is not None and b_engine.shut
    snap = {m["id"]: m for m in models.snapshot()}
    assert snap["b"]["state"] == "on disk" and snap["c"]["memory_bytes"] == 30 and snap["c"]["backend"] == "fake"
    assert [m["default"] for m in models.snapshot()] == [True, False, False, False]


async def test_a_busy_model_is_waited_for_then_unloaded() -> None:
    models, loads = registry(80, main=40, a=30, b=30)
    on_main = await models.acquire("main")  # a turn on the default all along
    running = await models.acquire("a")  # a turn on a
    waiting = asyncio.create_task(models.acquire("b"))
    await asyncio.sleep(0.05)
    assert not waiting.done() and models.find("a").state == "ready" and models.find("b").state == "on disk"
    assert models.find("b").leases == 1  # counted as one of b's requests while it waits
    running.release()  # the turn ends: a goes, b loads
    lease = await asyncio.wait_for(waiting, 2)
    assert lease.engine.model_info["name"] == "b-model" and models.find("a").state == "on disk"
    assert loads == ["main", "a", "b"] and models.default.state == "ready"
    on_main.release()


async def test_nothing_to_free_within_the_deadline_is_a_503_to_retry() -> None:
    models, _ = registry(80, wait_s=0.1, main=40, a=30, b=30)
    held = [await models.acquire("main"), await models.acquire("a")]
    with pytest.raises(ServiceError) as e:
        await models.acquire("b")
    assert e.value.code == "unavailable" and e.value.retry_after_s and "'b'" in e.value.message
    assert "main, a are busy" in e.value.message
    assert models.find("b").leases == 0 and models.find("a").state == "ready"
    for lease in held:
        lease.release()


async def test_a_model_over_the_budget_loads_alone() -> None:
    models, loads = registry(50, main=40, big=500)
    (await models.acquire("main")).release()
    lease = await models.acquire("big")
    assert lease.slot.state == "ready" and loads == ["main", "big"] and models.default.state == "on disk"


async def test_a_callers_engine_is_never_unloaded() -> None:
    """An engine handed in (create_app(engine=...)) is the caller's to shut down: room is made around it."""
    models, loads = registry(50, main=40, a=30, b=30)
    mine = FakeEngine("mine")
    models.adopt(models.default, mine, owned=False)
    (await models.acquire("a")).release()  # over the budget beside it: nothing else to unload
    (await models.acquire("b")).release()  # a goes, not the caller's
    assert loads == ["a", "b"] and models.default.engine is mine and not mine.shut
    assert models.find("a").state == "on disk"


async def test_a_failed_load_is_a_503_and_the_model_stays_on_disk() -> None:
    def load(spec: ModelSpec, progress: Any) -> Any:
        raise OSError("no such file")

    models = ModelRegistry.of([ModelSpec("main", "/m.gguf")], load, lambda s: 1, 10)
    with pytest.raises(ServiceError) as e:
        await models.acquire(None)
    assert e.value.code == "unavailable" and "no such file" in e.value.message
    assert models.default.state == "on disk" and models.default.error == "no such file"


async def test_a_request_gone_mid_load_leaves_the_load_to_finish() -> None:
    loads: list[str] = []

    def load(spec: ModelSpec, progress: Any) -> Any:
        time.sleep(0.2)
        loads.append(spec.alias)
        return FakeEngine(spec.alias)

    models = ModelRegistry.of([ModelSpec("main", "/m.gguf"), ModelSpec("a", "/a.gguf")], load, lambda s: 1, 10)
    first = asyncio.create_task(models.acquire("a"))
    await asyncio.sleep(0.05)
    assert models.find("a").state == "loading"
    first.cancel()
    lease = await asyncio.wait_for(models.acquire("a"), 2)  # waits for the same load, no second one
    assert lease.slot.state == "ready" and loads == ["a"] and lease.slot.leases == 1


async def test_each_model_has_its_own_admission_queue() -> None:
    """A full queue on one model does not hold up another's requests (each engine schedules its own steps)."""
    from types import SimpleNamespace

    from app.domain.admission import Admission
    from app.domain.admit import Admitter
    from app.domain.chat import _admitters
    from app.metrics import Metrics

    models, _ = registry(100, main=10, a=10, b=10)
    metrics = Metrics()
    default = Admitter(Admission(capacity=1, queue_size=4), metrics)
    _admitters(models, default, SimpleNamespace(key_slots=None), metrics, None)  # type: ignore[arg-type]
    a, b = models.find("a").admitter, models.find("b").admitter
    assert models.default.admitter is default and a is not b and a.admission.capacity == 1
    assert a.enter("k").granted and not a.enter("k").granted  # a is full: the next waits
    assert b.enter("k").granted and default.enter("k").granted  # b and the default are not
    assert {m["id"]: m["queued"] for m in models.snapshot()} == {"main": 0, "a": 1, "b": 0}
