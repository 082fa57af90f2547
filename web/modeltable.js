// The admin page's Models card: each served model's state (on disk, loading with the loader's last line, ready,
// unloading), the memory it counts against the budget, the requests holding it, its engine's decode tokens/s and KV
// use while loaded, and when it was last used, from
// /admin/api/stats `models` and `model_memory` (docs/models.md#several-models).
import { h } from "./dom.js";

const MIB = 1024 * 1024;
const size = (bytes) => (bytes >= 1024 * MIB ? (bytes / 1024 / MIB).toFixed(1) + " GiB" : Math.round(bytes / MIB) + " MiB");
const ago = (s) => (s === null || s === undefined ? "–" : s < 60 ? Math.round(s) + " s ago" : Math.round(s / 60) + " min ago");

/** Redraw the table body from `models` (the stats' list) and the budget line from `memory`. */
export function renderModels(models, memory, body, count) {
  const rows = models.map((m) => h("tr", { dataset: { testid: "admin-model", name: m.id, state: m.state } },
    h("td", {}, m.id, m.default ? h("span.faint", {}, " default") : ""),
    h("td", {}, h("span.pill." + String(m.state).replace(/[^a-z_-]/gi, ""), {}, m.state),
      m.progress ? h("span.faint", {}, " " + m.progress) : "", m.error ? h("span.error", {}, " " + m.error) : ""),
    h("td.num", {}, size(m.memory_bytes)),
    h("td.num", { dataset: { testid: "admin-model-requests" } }, m.requests + " (" + m.running + " running, " + m.queued + " queued)"),
    h("td.num", { dataset: { testid: "admin-model-decode" } }, m.decode_tok_s == null ? "–" : m.decode_tok_s.toFixed(1) + " tok/s"),
    h("td.num", {}, m.kv_usage == null ? "–" : (m.kv_usage * 100).toFixed(1) + " %"),
    h("td.num", {}, ago(m.idle_s))));
  if (!rows.length) rows.push(h("tr.empty-row", {}, h("td", { colSpan: 7 }, "No models")));
  body.replaceChildren(...rows);
  count.textContent = memory ? size(memory.used_bytes) + " of " + size(memory.budget_bytes) : "";
}
