// The settings drawer of the open session: system prompt, temperature, top p, max tokens, tools (a JSON list),
// MCP tools (web/mcptools.js).
import { api } from "./api.js";
import { state } from "./state.js";
import { $ } from "./chrome.js";
import { upsertSession } from "./sessions.js";
import { fillMcpTools, chosenMcpTools } from "./mcptools.js";

const SAVED_MS = 2000;

/** Open or close the drawer (toggle when `open` is undefined); focus moves in and back out. */
export function toggleSettings(open) {
  const panel = $("settings");
  const show = open ?? panel.hidden;
  if (show === !panel.hidden) return;
  const hadFocus = panel.contains(document.activeElement);
  panel.hidden = !show;
  $("toggle-settings").setAttribute("aria-expanded", String(show));
  if (show) {
    fillSettings();
    $("set-system").focus();
  } else if (hadFocus) {
    $("toggle-settings").focus();
  }
}

/** Follow the open session: refill the fields (unless they are being edited) or close without one. */
export function syncSettings() {
  if (!state.current) toggleSettings(false);
  else if (!$("settings").hidden && !$("settings").contains(document.activeElement)) fillSettings();
}

export function showTemperature() {
  $("temp-out").textContent = Number($("set-temperature").value).toFixed(2);
}

function fillSettings() {
  const s = state.current || {};
  const st = s.settings || {};
  $("set-system").value = s.system_prompt || "";
  $("set-temperature").value = st.temperature ?? 0.7;
  showTemperature();
  $("set-top-p").value = st.top_p ?? 1;
  $("set-max-tokens").value = st.max_tokens ?? 512;
  $("set-tools").value = st.tools ? JSON.stringify(st.tools, null, 2) : "";
  fillMcpTools(st.mcp_tools);
  $("settings-error").textContent = "";
  $("settings-saved").hidden = true;
}

export async function saveSettings(e) {
  e.preventDefault();
  if (!state.current) return;
  const err = $("settings-error");
  const temperature = Number($("set-temperature").value);
  const topP = Number($("set-top-p").value);
  const maxTokens = Number($("set-max-tokens").value);
  if (!Number.isFinite(topP) || topP <= 0 || topP > 1) { err.textContent = "Top p must be a number in (0, 1]."; return; }
  if (!Number.isInteger(maxTokens) || maxTokens < 1) { err.textContent = "Max tokens must be a whole number of at least 1."; return; }
  const toolsText = $("set-tools").value.trim();
  let tools = null;
  if (toolsText) {
    try { tools = JSON.parse(toolsText); } catch (error) { tools = undefined; }
    if (!Array.isArray(tools)) { err.textContent = "Tools must be a JSON list of tool definitions."; return; }
  }
  const system = $("set-system").value;
  try {
    upsertSession(await api.updateSession(state.current.id, {
      system_prompt: system.trim() ? system : null,
      settings: { temperature, top_p: topP, max_tokens: maxTokens, tools, mcp_tools: chosenMcpTools() },
    }));
    err.textContent = "";
    $("settings-saved").hidden = false;
    setTimeout(() => { $("settings-saved").hidden = true; }, SAVED_MS);
  } catch (error) {
    err.textContent = error.message;
  }
}
