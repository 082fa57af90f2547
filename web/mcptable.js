// The admin page's MCP cards: each server (state, tool count, starts, last error) and each tool's calls, errors and
// latency, from /admin/api/stats `mcp` (docs/mcp.md#metrics).
import { h } from "./dom.js";

const ms = (v) => (v === null || v === undefined ? "–" : (v >= 100 ? Math.round(v) : Number(v).toFixed(1)) + " ms");

/** Redraw the two tables' bodies from `servers` (the stats' `mcp` list). */
export function renderMcp(servers, serverBody, toolBody) {
  const rows = servers.map((s) => h("tr", { dataset: { testid: "admin-mcp-server", name: s.name, state: s.state } },
    h("td", {}, s.name, " ", h("span.faint", {}, s.transport)),
    h("td", {}, h("span.pill." + String(s.state).replace(/[^a-z_-]/gi, ""), {}, s.state)),
    h("td.num", { dataset: { testid: "admin-mcp-tool-count" } }, String((s.tools || []).length)),
    h("td.num", { dataset: { testid: "admin-mcp-starts" } }, String(s.starts)),
    h("td.error", { dataset: { testid: "admin-mcp-error" } }, s.error || "")));
  if (!rows.length) rows.push(h("tr.empty-row", {}, h("td", { colSpan: 5 }, "No MCP servers")));
  serverBody.replaceChildren(...rows);

  const tools = servers.flatMap((s) => (s.tools || []).map((t) => h("tr",
    { dataset: { testid: "admin-mcp-tool", name: t.name } },
    h("td", {}, h("code", {}, t.name)),
    h("td.num", { dataset: { testid: "admin-mcp-calls" } }, String(t.calls)),
    h("td.num", { dataset: { testid: "admin-mcp-errors" } }, String(t.errors)),
    h("td.num", {}, ms(t.mean_ms)),
    h("td.num", {}, ms(t.last_ms)))));
  if (!tools.length) tools.push(h("tr.empty-row", {}, h("td", { colSpan: 5 }, "No MCP tools")));
  toolBody.replaceChildren(...tools);
}
