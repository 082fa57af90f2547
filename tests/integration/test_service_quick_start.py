"""A new machine (numba's compile cache empty): `forge serve` answers at once on the float32 reference while the
CPU kernels compile, then switches to them between two steps (engine/backend_swap.py). Greedy replies equal the
reference before the switch, after it, and across it.

One real cold compile (tens of seconds on two busy cores): the only such test in the suite.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.conftest import API_KEY, ServerProcess, serving

COMPILE_DEADLINE_S = 900.0  # generous: a cold compile on a loaded two-core machine
LOADING = "loading the compiled kernels"  # the stage between the compile and the switch (engine/backend_swap.py)
SPANNING = (1, 2)  # fixture prompts whose 32 greedy tokens hold no end of turn: every reply is 32 tokens long


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("forge-cold")
    (tmp / "numba").mkdir()
    env = {"NUMBA_CACHE_DIR": str(tmp / "numba"), "FORGE_SPEC_ROW_COST": "0.5"}
    with serving(tmp, env, wait_compiled=False) as srv:  # ready as soon as the reference serves
        yield srv


def ready(server: ServerProcess) -> dict:
    r = httpx.get(server.url + "/ready", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def complete(server: ServerProcess, prompt_ids: list[int], max_tokens: int = 32) -> dict:
    body = {"model": "default", "prompt": prompt_ids, "temperature": 0, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def assert_reference(reply: dict, case: dict) -> None:
    """The greedy reply of a fixture prompt equals the reference's 32 tokens (or its reply up to end of turn)."""
    choice = reply["choices"][0]
    if case["stopped_at_eos"] and len(case["generated_ids"]) <= 32:
        assert choice["text"] == case["generated_text_skip_special"]
        assert reply["usage"]["completion_tokens"] == case["n_generated"]
    else:
        assert choice["text"] == case["greedy32_no_eos_stop_text"]
        assert reply["usage"]["completion_tokens"] == 32


@dataclass(slots=True)
class Turn:
    before: str  # the backend /ready named just before the request
    after: str  # ... and just after its reply
    reply: dict
    case: dict


def test_cold_start_serves_on_the_reference_then_switches_without_changing_greedy_replies(
    cold_server: ServerProcess, reference: dict
) -> None:
    server = cold_server
    first = ready(server)
    assert first["backend"] == "numpy", first
    assert first["background_compile"]["phase"] == "compiling", first

    # Every fixture prompt answered while the kernels compile: the reference backend served them.
    for case in reference["prompts"]:
        assert_reference(complete(server, case["prompt_ids"]), case)
    during = ready(server)
    assert during["backend"] == "numpy" and during["background_compile"]["phase"] in ("compiling", "ready"), during
    admin = server.stats()["model"]
    assert admin["backend"] == "numpy" and admin["background_compile"]["error"] is None, admin
    metrics = httpx.get(server.url + "/metrics", headers=server.admin_headers(), timeout=30).text
    assert re.search(r'forge_model_info\{[^}]*backend="numpy"', metrics) and re.search(
        r'^forge_kernels_compiling\{model="[^"]+"\} 1.0$', metrics, re.M
    )

    # Once the kernels are compiled and load into the server (seconds before the switch), two clients ask back to
    # back until the switch, so that a reply is in flight when it comes; idle before, the compile runs unhindered.
    deadline = time.monotonic() + COMPILE_DEADLINE_S
    while (state := ready(server))["background_compile"]["stage"] != LOADING:
        assert state["background_compile"]["phase"] == "compiling", state
        assert time.monotonic() < deadline, f"still compiling after {COMPILE_DEADLINE_S}s:\n{server.log_tail()}"
        time.sleep(0.05)
    turns: list[Turn] = []
    switched = threading.Event()
    failures: list[BaseException] = []

    def client(case: dict) -> None:
        try:
            deadline = time.monotonic() + COMPILE_DEADLINE_S
            while time.monotonic() < deadline:
                before = ready(server)["backend"]
                reply = complete(server, case["prompt_ids"])
                after = ready(server)["backend"]
                turns.append(Turn(before, after, reply, case))
                if before == "numba":  # one reply wholly on the compiled kernels: done
                    switched.set()
                    return
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(reference["prompts"][i],)) for i in SPANNING]
    for t in threads:
        t.start()
    for t in threads:
        t.join(COMPILE_DEADLINE_S + 60)
    assert not failures, failures
    assert switched.is_set(), f"no switch to numba within {COMPILE_DEADLINE_S}s:\n{server.log_tail()}"

    for turn in turns:
        assert_reference(turn.reply, turn.case)
    assert any(t.before == "numpy" and t.after == "numba" for t in turns), [(t.before, t.after) for t in turns]
    assert any(t.before == "numba" for t in turns)

    # After the switch: the compiled kernels serve every fixture prompt the same.
    for case in reference["prompts"]:
        assert_reference(complete(server, case["prompt_ids"]), case)
    done = ready(server)
    assert done["backend"] == "numba" and done["background_compile"]["phase"] == "done", done
    assert done["background_compile"]["step"] == done["background_compile"]["steps"] > 0
    admin = server.stats()["model"]
    assert admin["backend"] == "numba" and admin["kernel_routes"] and all(c["ok"] for c in admin["kernel_routes"])
    metrics = httpx.get(server.url + "/metrics", headers=server.admin_headers(), timeout=30).text
    assert re.search(r'forge_model_info\{[^}]*backend="numba"', metrics) and re.search(
        r'^forge_kernels_compiling\{model="[^"]+"\} 0.0$', metrics, re.M
    )
    log = server.log_path.read_text()
    assert "compiling CPU kernels 1/7 (matvec) in the background" in log and "now serving on numba" in log
