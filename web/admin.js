// Forge admin page: polls /admin/api/stats every second and draws the live charts.
import { LineChart } from "./chart.js";
import { h } from "./dom.js";
import { renderMcp } from "./mcptable.js";
import { renderModels } from "./modeltable.js";

const POLL_MS = 1000;
const TOKEN_KEY = "forge-admin-token";
const $ = (id) => document.getElementById(id);

const pct = (v) => {
  const p = v * 100;
  const s = p === 0 ? "0" : p < 1 ? p.toFixed(2).replace(/\.?0+$/, "") : p < 10 ? p.toFixed(1).replace(/\.0$/, "") : String(Math.round(p));
  return s + "%";
};
const num = (v) => (v >= 100 ? String(Math.round(v)) : Number(v).toFixed(v >= 10 ? 1 : 2).replace(/\.?0+$/, "") || "0");

const charts = {
  tokens: new LineChart(canvas("tokens"), { series: [{ color: "--accent" }], format: num }),
  queue: new LineChart(canvas("queue"), { series: [{ color: "--accent" }, { color: "--warn" }], format: num }),
  kv: new LineChart(canvas("kv"), { series: [{ color: "--accent" }], max: 1, format: pct }),
  prefix: new LineChart(canvas("prefix"), { series: [{ color: "--ok" }], max: 1, format: pct }),
  ttft: new LineChart(canvas("ttft"), { series: [{ color: "--accent" }, { color: "--warn" }], format: (v) => Math.round(v) + "" }),
  itl: new LineChart(canvas("itl"), { series: [{ color: "--accent" }, { color: "--warn" }], format: (v) => Math.round(v) + "" }),
};

function canvas(name) {
  return document.querySelector(`canvas[data-chart="${name}"]`);
}

/** The first defined number among dotted paths of `obj`. */
function pick(obj, ...paths) {
  for (const path of paths) {
    let v = obj;
    for (const key of path.split(".")) v = v == null ? undefined : v[key];
    if (v !== undefined && v !== null && v !== "" && Number.isFinite(Number(v))) return Number(v);
  }
  return null;
}

function token() {
  const fromUrl = new URLSearchParams(location.search).get("token");
  if (fromUrl) sessionStorage.setItem(TOKEN_KEY, fromUrl);
  return fromUrl || sessionStorage.getItem(TOKEN_KEY) || "";
}

let timer = 0;

async function poll() {
  clearTimeout(timer);
  const t = token();
  try {
    const res = await fetch("/admin/api/stats", { headers: t ? { Authorization: "Bearer " + t } : {}, cache: "no-store" });
    if (res.status === 401) {
      showAuth(t ? "That token was not accepted." : "");
      return; // polling resumes after a token is entered
    }
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    update(await res.json());
    setLive("live", "Live · updated " + new Date().toLocaleTimeString());
  } catch (err) {
    setLive("error", "Disconnected (" + err.message + ")");
  }
  timer = setTimeout(poll, POLL_MS);
}

function setLive(st, text) {
  $("live").dataset.state = st;
  $("live-text").textContent = text;
}

function showAuth(message) {
  $("auth").hidden = false;
  $("dashboard").hidden = true;
  $("auth-error").textContent = message;
  setLive("error", "Token required");
  $("token").focus();
}

function update(s) {
  const e = s.engine || s.stats || s;
  const tokS = pick(s, "tokens_per_s", "decode_tok_s", "engine.decode_tok_s", "stats.decode_tok_s") ?? 0;
  const running = pick(e, "running") ?? 0;
  const waiting = pick(e, "waiting") ?? 0;
  let kv = pick(e, "kv_usage");
  if (kv === null) {
    const used = pick(e, "kv_blocks_used");
    const total = pick(e, "kv_blocks_total");
    kv = used !== null && total ? used / total : 0;
  }
  const hit = pick(e, "prefix_hit_rate") ?? 0;
  const ttft50 = pick(s, "ttft_ms.p50", "percentiles.ttft_ms.p50", "latency.ttft_ms.p50");
  const ttft95 = pick(s, "ttft_ms.p95", "percentiles.ttft_ms.p95", "latency.ttft_ms.p95");
  const itl50 = pick(s, "itl_ms.p50", "percentiles.itl_ms.p50", "latency.itl_ms.p50");
  const itl95 = pick(s, "itl_ms.p95", "percentiles.itl_ms.p95", "latency.itl_ms.p95");

  charts.tokens.push([tokS]);
  charts.queue.push([running, waiting]);
  charts.kv.push([kv]);
  charts.prefix.push([hit]);
  charts.ttft.push([ttft50, ttft95]);
  charts.itl.push([itl50, itl95]);

  value("tokens", num(tokS));
  value("queue", running + " running · " + waiting + " waiting");
  value("kv", pct(kv));
  value("prefix", pct(hit));
  value("ttft", pair(ttft50, ttft95));
  value("itl", pair(itl50, itl95));

  // A new machine serves on the float32 reference while its CPU kernels compile (engine/backend_swap.py).
  const compileState = (c) => !c ? null : c.phase === "compiling"
    ? "in the background, " + c.step + "/" + c.steps + " (" + c.stage + ") · " + c.seconds + " s"
    : c.phase === "failed" ? "failed: " + c.error
    : (c.phase === "ready" ? "compiled, switching" : "done") + " in " + c.seconds + " s";
  const model = s.model || s.model_info || {};
  $("model-name").textContent = model.name || "";
  facts($("model-facts"), [
    ["Name", model.name], ["Architecture", model.arch], ["Quantization", model.quant], ["Backend", model.backend],
    ["Kernel compile", compileState(model.background_compile)],
    ["Parameters", model.num_params != null ? humanCount(model.num_params) : null],
    ["Context", model.context_length != null ? model.context_length + " tokens" : null],
    ["Layers", model.num_layers], ["Hidden size", model.hidden_size], ["Vocabulary", model.vocab_size], ["File", model.path ? String(model.path).split(/[\\/]/).pop() : null],
  ]);

  // The start-up parity gate: each product route the model takes, checked against the reference.
  facts($("kernel-routes"), (model.kernel_cpu ? [["CPU", model.kernel_cpu]] : []).concat((model.kernel_routes || []).map((c) => [
    c.form + ", " + c.rows + (c.rows === 1 ? " row" : " rows"),
    c.ok ? c.route + " · ok" : c.route + " · failed, replaced by " + (c.replaced_by || "nothing"),
  ])));

  const finished = e.requests_finished || {};
  facts($("totals"), [
    ["Prompt tokens", pick(e, "prompt_tokens_total")],
    ["Cached tokens", pick(e, "cached_tokens_total")],
    ["Generated tokens", pick(e, "generated_tokens_total")],
    ["KV blocks", pick(e, "kv_blocks_total") !== null ? (pick(e, "kv_blocks_used") ?? 0) + " / " + pick(e, "kv_blocks_total") : null],
    ["Engine steps", pick(e, "steps")],
    ["KV spilled", spill(e, "kv_spilled_blocks", "kv_spilled_bytes")],
    ["KV restored", spill(e, "kv_restored_blocks", "kv_restored_bytes")],
    ["KV spill hit rate / restore time", pick(e, "kv_spill_lookups") !== null
      ? pct(pick(e, "kv_spill_hit_rate") ?? 0) + " · " + duration(pick(e, "kv_spill_restore_seconds") ?? 0) : null],
    ["WebSockets", pick(s, "websocket_connections")],
    ["Uptime", pick(s, "uptime_s") !== null ? duration(pick(s, "uptime_s")) : null],
    ["Requests finished", Object.keys(finished).length ? Object.entries(finished).map(([k, v]) => k + " " + v).join(" · ") : null],
  ]);

  const sessions = s.active_sessions || s.sessions || [];
  $("session-count").textContent = "(" + sessions.length + ")";
  const rows = sessions.map((x) => h("tr", { dataset: { testid: "admin-session-row", id: x.id } },
    h("td", {}, x.title || "Untitled"),
    h("td", {}, h("span.pill." + String(x.status || "idle").replace(/[^a-z_-]/gi, ""), {}, x.status || "idle")),
    h("td.id", { title: x.id }, String(x.id).slice(0, 8))));
  if (!rows.length) rows.push(h("tr.empty-row", {}, h("td", { colSpan: 3 }, "No active sessions")));
  $("sessions").replaceChildren(...rows);
  renderMcp(s.mcp || [], $("mcp-servers"), $("mcp-tools"));
  renderModels(s.models || [], s.model_memory, $("models"), $("model-memory"));
}

function pair(p50, p95) {
  if (p50 === null) return "–";
  const f = (v) => (v >= 100 ? Math.round(v) : Number(v).toFixed(1));
  return p95 === null ? f(p50) + " ms" : f(p50) + " / " + f(p95) + " ms";
}

function value(name, text) {
  document.querySelector(`[data-value="${name}"]`).textContent = text;
}

function facts(dl, pairs) {
  const nodes = [];
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    nodes.push(h("dt", {}, k), h("dd", {}, typeof v === "number" ? v.toLocaleString() : String(v)));
  }
  dl.replaceChildren(...nodes);
}

function duration(sec) {
  const d = Math.floor(sec / 86400), hh = Math.floor((sec % 86400) / 3600), mm = Math.floor((sec % 3600) / 60);
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${mm}m` : `${mm}m ${Math.floor(sec % 60)}s`;
}

function spill(e, blocks, bytes) {
  const n = pick(e, blocks);
  return n === null ? null : n.toLocaleString() + " blocks · " + ((pick(e, bytes) ?? 0) / 1e6).toFixed(1) + " MB";
}

function humanCount(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " B";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + " M";
  return n.toLocaleString();
}

$("auth").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = $("token").value.trim();
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  const url = new URL(location.href);
  url.searchParams.delete("token");
  history.replaceState(null, "", url);
  $("auth").hidden = true;
  $("dashboard").hidden = false;
  poll();
});

poll();
