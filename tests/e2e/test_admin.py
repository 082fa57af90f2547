"""The admin page against the real service: token protection, live charts fed by real
generations, the model's facts and the active sessions."""

from __future__ import annotations

import threading

CHARTS = ("tokens", "queue", "kv", "prefix", "ttft", "itl")
SERIES_COLORS = {
    "tokens": ["--accent"],
    "queue": ["--accent", "--warn"],
    "kv": ["--accent"],
    "prefix": ["--ok"],
    "ttft": ["--accent", "--warn"],
    "itl": ["--accent", "--warn"],
}

# Pixels in the chart's series colours drawn above its zero line (the grid and labels use other colours).
RAISED_PIXELS = """([name, colorVars]) => {
    const c = document.querySelector(`canvas[data-chart="${name}"]`);
    const probe = document.createElement('canvas').getContext('2d');
    const rgbs = colorVars.map(v => {
        probe.fillStyle = getComputedStyle(c).getPropertyValue(v).trim();
        const hex = probe.fillStyle;  // normalised to #rrggbb
        return [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    });
    const dpr = c.width / c.clientWidth;
    const zeroY = Math.floor((c.clientHeight - 6) * dpr) - Math.ceil(3 * dpr);
    const d = c.getContext('2d').getImageData(0, 0, c.width, zeroY).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4)
        if (d[i + 3] > 200 && rgbs.some(([R, G, B]) =>
                Math.abs(d[i] - R) + Math.abs(d[i + 1] - G) + Math.abs(d[i + 2] - B) < 60)) n++;
    return n;
}"""


def _max(page, name: str) -> float:
    return float(page.get_attribute(f'canvas[data-chart="{name}"]', "data-max") or 0)


def test_admin_page_and_feed_need_the_token(server, page):
    assert server.http.get("/admin").status_code == 401
    assert server.http.get("/admin/api/stats").status_code == 401
    assert server.http.get("/admin/api/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert (
        server.http.get("/admin/api/stats", headers={"Authorization": f"Bearer {server.admin_token}"}).status_code
        == 200
    )
    assert page.goto("/admin").status == 401

    assert page.goto(f"/admin?token={server.admin_token}").status == 200
    page.wait_for_selector('[data-testid="admin-status"][data-state="live"]')
    # a stale token (e.g. the server restarted with another one): the page asks for the token
    page.evaluate("history.replaceState(null, '', '/admin?token=stale')")
    page.get_by_test_id("admin-auth").wait_for(state="visible")
    assert page.locator("#dashboard").is_hidden()
    page.get_by_test_id("admin-token-input").fill(server.admin_token)
    page.get_by_test_id("admin-token-submit").click()
    page.wait_for_selector('[data-testid="admin-status"][data-state="live"]')
    assert page.locator("#dashboard").is_visible()
    assert page.get_by_test_id("admin-auth").is_hidden()


def test_admin_charts_show_live_numbers_while_a_reply_streams(server, page, reference, screenshot):
    page.goto(f"/admin?token={server.admin_token}")
    page.wait_for_selector('[data-testid="admin-status"][data-state="live"]')
    first = int(page.get_attribute('canvas[data-chart="tokens"]', "data-points"))
    page.wait_for_function(
        "n => +document.querySelector('canvas[data-chart=tokens]').dataset.points >= n + 2", arg=first
    )  # a new sample every second

    # one short turn (latency percentiles, cached prefix blocks), then a long one that shares its prefix
    sid = server.create_session(title="admin chart test", settings={"max_tokens": 4, "temperature": 0})["id"]
    events = server.chat(sid, reference["prompts"][0]["messages"][-1]["content"])
    assert events[-1][0] == "done"
    r = server.http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 400}})
    assert r.status_code == 200, r.text

    stop = threading.Event()

    def long_turn() -> None:
        # leaving the stream early disconnects, and the server stops the reply
        with server.http.stream(
            "POST",
            f"/api/sessions/{sid}/messages",
            json={"content": "Write a long story about a dragon who learns to fly."},
            timeout=300.0,
        ) as resp:
            for _ in resp.iter_lines():
                if stop.is_set():
                    return

    worker = threading.Thread(target=long_turn, daemon=True)
    worker.start()
    try:
        page.wait_for_selector(f'[data-testid="admin-session-row"][data-id="{sid}"]')
        assert "admin chart test" in page.locator(f'[data-testid="admin-session-row"][data-id="{sid}"]').inner_text()
        page.wait_for_function(
            "names => names.every(n => +document.querySelector(`canvas[data-chart=\"${n}\"]`).dataset.max > 0)",
            arg=list(CHARTS),
        )
        screenshot(page, "admin-live")
    finally:
        stop.set()
        worker.join(timeout=120)

    for name in CHARTS:
        assert _max(page, name) > 0, name
        assert page.evaluate(RAISED_PIXELS, [name, SERIES_COLORS[name]]) > 0, f"{name}: no line above zero"

    stats = server.http.get("/admin/api/stats", headers={"Authorization": f"Bearer {server.admin_token}"}).json()
    facts = page.get_by_test_id("admin-model-facts").inner_text()
    assert stats["model"]["name"] in facts
    assert f"{stats['model']['context_length']} tokens" in facts
    assert page.get_by_test_id("admin-model-name").inner_text() == stats["model"]["name"]
    # the start-up parity gate's checks: one line per route the model takes, each "ok" on the default server
    routes = page.get_by_test_id("admin-kernel-routes").inner_text()
    for check in stats["model"]["kernel_routes"]:
        assert f"{check['route']} · ok" in routes and check["form"] in routes, (check, routes)
    assert stats["engine"]["prefix_hit_rate"] > 0
    # the session leaves the active list once its reply is stopped
    page.wait_for_selector(f'[data-testid="admin-session-row"][data-id="{sid}"]', state="detached")
