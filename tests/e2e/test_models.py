"""The model picker in the chat header, against a server of its own serving the default model and a tiny synthetic
one: it lists /v1/models, shows the open session's model, stores the one chosen (kept over a reload), the admin page
lists both models, and both pages stay axe-clean."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from axe_playwright_python.sync_playwright import Axe

from engine.loader.synth import shape_from_hf, write_synthetic
from tests.e2e.conftest import UI_TIMEOUT_MS, Server, run_server

ADMIN_TOKEN = "e2e-models-admin-token"
TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("e2e-models")
    write_synthetic(shape_from_hf(TINY, "tiny"), "q4_0", tmp / "tiny.gguf")
    with run_server(
        tmp, "e2e-models-server.log", FORGE_ADMIN_TOKEN=ADMIN_TOKEN, FORGE_MODELS=f"default,tiny={tmp / 'tiny.gguf'}"
    ) as srv:
        yield srv


def _violations(page) -> list[str]:
    found = Axe().run(page).response["violations"]
    return [f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:6]}" for v in found]


def test_the_model_picker_sets_the_sessions_model(browser, models_server: Server) -> None:
    sid = models_server.create_session(title="Picking a model")["id"]
    default_id = models_server.http.get("/v1/models").json()["data"][0]["id"]
    ctx = browser.new_context(base_url=models_server.base_url, viewport={"width": 1280, "height": 820})
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"/#/s/{sid}")
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
        picker = page.get_by_label("Model", exact=True)  # the select, by its visible label
        picker.wait_for(state="visible", timeout=20_000)
        page.wait_for_function("() => !document.getElementById('model-picker').disabled")
        assert picker.evaluate("s => [...s.options].map(o => o.value)") == [default_id, "tiny"]
        assert picker.input_value() == default_id  # none stored: the default
        picker.focus()
        picker.select_option("tiny")
        deadline = time.monotonic() + 30
        while models_server.session(sid)["model"] != "tiny":
            assert time.monotonic() < deadline, "the session's model was not stored"
            time.sleep(0.1)
        assert _violations(page) == [], "the chat page with the model picker"
        page.reload()
        page.wait_for_function("() => document.getElementById('model-picker').value === 'tiny'")

        page.goto(f"/admin?token={ADMIN_TOKEN}")
        page.wait_for_selector('[data-testid="admin-model"][data-name="tiny"]')
        assert page.locator('[data-testid="admin-model"]').count() == 2
        row = page.locator(f'[data-testid="admin-model"][data-name="{default_id}"]')
        assert row.get_by_test_id("admin-model-decode").inner_text().endswith("tok/s")  # loaded: its engine's rate
        assert _violations(page) == [], "the admin page with the models card"
        assert not errors, errors
    finally:
        ctx.close()
