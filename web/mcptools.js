// The "Tools (MCP)" group of the settings drawer: one checkbox per tool the MCP servers list (GET /api/mcp/tools),
// ticked as the session's `settings.mcp_tools` holds it. Hidden while no server lists a tool.
import { api } from "./api.js";
import { $ } from "./chrome.js";

let listed = [];
// Chosen names no server lists now: kept on save, so a server that is down does not cost the session its choice.
let unlisted = [];
let fills = 0; // a refill started later wins over an earlier one still waiting for its listing

/** Refill the group for a session's `mcp_tools` (null: none), listing the tools anew (servers may have changed). */
export async function fillMcpTools(chosen) {
  const fill = ++fills;
  let tools = [];
  try {
    tools = await api.mcpTools();
  } catch (error) {
    // a failed listing: the drawer works without the group
  }
  if (fill !== fills) return;
  listed = tools;
  const picked = new Set(chosen || []);
  unlisted = [...picked].filter((name) => !listed.some((t) => t.name === name));
  const list = $("set-mcp-list");
  list.replaceChildren(...listed.map((t) => toolRow(t, picked.has(t.name))));
  $("set-mcp").hidden = listed.length === 0;
}

function toolRow(tool, checked) {
  const label = document.createElement("label");
  label.className = "check";
  const box = document.createElement("input");
  box.type = "checkbox";
  box.value = tool.name;
  box.checked = checked;
  box.dataset.testid = "settings-mcp-tool";
  const name = document.createElement("span");
  name.textContent = tool.name;
  label.append(box, name);
  if (tool.description) label.title = tool.description;
  return label;
}

/** The session's `mcp_tools` as the drawer has them (null: none), or undefined (leave them) without a listing. */
export function chosenMcpTools() {
  if (listed.length === 0) return undefined;
  const ticked = [...$("set-mcp-list").querySelectorAll("input:checked")].map((box) => box.value);
  const all = [...ticked, ...unlisted];
  return all.length ? all : null;
}
