// The open session's messages on the page: the list, replies growing while they stream, and each
// message's controls (its branch switch; copy, edit and resend, regenerate).
import { state, emit, currentId, isBusy } from "./state.js";
import { $ } from "./chrome.js";
import { h, icon, copyText, keepFocus } from "./dom.js";
import { messageView, renderMessage, renderBody } from "./message.js";
import { send } from "./commands.js";
import { branchSwitch } from "./branches.js";

const FLASH_MS = 1500; // how long "Copied" shows on a Copy button

const views = new Map(); // message id -> View (message.js)
const dirty = new Set(); // replies with text not drawn yet
let drawScheduled = false;
let drawCost = 0; // ms the last draw of streaming replies took
let editing = null; // id of the user message being edited in place
let replacing = null; // id of the reply a regenerate will replace

export function findMessage(id) {
  return state.messages.find((m) => m.id === id);
}

/** The position a message arriving without one (a delta before its message.created) takes. */
export function nextPosition() {
  return state.messages.length ? Math.max(...state.messages.map((m) => m.position ?? 0)) + 1 : 0;
}

/** Show `messages` (the open session's stored history) instead of what is on the page. */
export function setMessages(messages) {
  delete $("conversation").dataset.loading;
  state.messages = messages.map((m) => ({ ...m })).sort((a, b) => (a.position ?? 0) - (b.position ?? 0));
  views.clear();
  dirty.clear();
  editing = null;
  replacing = null;
  const sid = currentId();
  const live = state.messages.find((m) => m.status === "streaming" && m.role === "assistant");
  if (sid) {
    if (live) state.streaming.set(sid, live.id);
    else state.streaming.delete(sid);
  }
  keepPlace(() => $("messages").replaceChildren(...state.messages.map((m) => addView(m).root)));
  showEmptyState();
  emit("busy");
  scrollToBottom(true);
}

/** Empty the list while the open session's history is on its way. */
export function showLoading() {
  setMessages([]);
  $("conversation").dataset.loading = "1";
  showEmptyState();
}

/** Add a message the server created (or update it when it is already shown); returns the stored copy. */
export function addMessage(msg) {
  const existing = findMessage(msg.id);
  if (existing) {
    Object.assign(existing, msg);
    updateMessage(existing);
    return existing;
  }
  // a new message at position P replaces whatever the server deleted from P on
  const doomed = state.messages.filter((m) => (m.position ?? 0) >= (msg.position ?? Infinity) || m.id === replacing);
  for (const m of doomed) removeMessage(m.id);
  if (msg.role === "assistant") replacing = null;
  const copy = { ...msg };
  state.messages.push(copy);
  state.messages.sort((a, b) => (a.position ?? 0) - (b.position ?? 0));
  const view = addView(copy);
  const after = state.messages[state.messages.indexOf(copy) + 1];
  const before = after && views.get(after.id);
  $("messages").insertBefore(view.root, before ? before.root : null);
  refreshActions();
  showEmptyState();
  scrollToBottom(true);
  return copy;
}

function addView(msg) {
  const view = messageView(msg);
  views.set(msg.id, view);
  return view;
}

function removeMessage(id) {
  const view = views.get(id);
  if (view) keepPlace(() => view.root.remove());
  views.delete(id);
  state.messages = state.messages.filter((m) => m.id !== id);
}

/** Redraw `msg` after its fields changed. */
export function updateMessage(msg) {
  const view = views.get(msg.id);
  if (!view) return;
  dirty.delete(msg.id);
  const stick = nearBottom();
  renderMessage(msg, view);
  refreshActions();
  if (stick) scrollToBottom();
}

/** Append streamed text to a reply; it is drawn with the next animation frame. */
export function appendText(msg, text) {
  msg.content += text;
  dirty.add(msg.id);
  if (drawScheduled) return;
  drawScheduled = true;
  // a long reply costs more to draw: wait as long as the last draw took, so the page stays responsive
  setTimeout(() => requestAnimationFrame(drawDirty), drawCost);
}

function drawDirty() {
  drawScheduled = false;
  const started = performance.now();
  const stick = nearBottom();
  for (const id of dirty) {
    const msg = findMessage(id);
    const view = views.get(id);
    if (msg && view) renderBody(msg, view);
  }
  dirty.clear();
  if (stick) scrollToBottom();
  drawCost = performance.now() - started;
}

/** Run `render` (which rebuilds messages) without losing the keyboard user's place: the focus goes
 *  back to the rebuilt twin of its element, or to the composer when that is gone. */
function keepPlace(render) {
  const list = $("messages");
  const had = list.contains(document.activeElement);
  keepFocus(list, render);
  if (had && !list.contains(document.activeElement)) $("input").focus();
}

function showEmptyState() {
  $("empty-state").hidden = state.messages.length > 0 || $("conversation").dataset.loading === "1";
}

// ---- actions ----------------------------------------------------------------------

/** Redraw every message's controls (they depend on the busy state and the last reply). */
export function refreshActions() {
  const busy = isBusy();
  const lastAssistant = [...state.messages].reverse().find((m) => m.role === "assistant");
  keepPlace(() => {
    for (const msg of state.messages) {
      const view = views.get(msg.id);
      if (!view || editing === msg.id) continue;
      const branches = branchSwitch(msg, busy);
      view.branches.replaceChildren(...(branches ? [branches] : []));
      if (msg.status === "streaming") { view.actions.replaceChildren(); continue; }
      const buttons = [actionButton("copy", "Copy", "message-copy", () => copyMessage(msg, view))];
      if (msg.role === "user") buttons.push(actionButton("edit", "Edit", "message-edit", () => startEdit(msg), busy));
      if (msg === lastAssistant) buttons.push(actionButton("regen", "Regenerate", "message-regenerate", () => regenerate(msg), busy));
      view.actions.replaceChildren(...buttons);
    }
  });
}

// Unavailable actions stay focusable (aria-disabled), so a keyboard user's place is not lost.
function actionButton(iconName, label, testid, onclick, disabled = false) {
  return h("button.action", { type: "button", "aria-disabled": disabled ? "true" : null, dataset: { testid },
    onclick: () => { if (!disabled) onclick(); } }, icon(iconName), h("span", {}, label));
}

async function copyMessage(msg, view) {
  const ok = await copyText(msg.content || "");
  const btn = view.actions.querySelector('[data-testid="message-copy"]');
  if (btn) {
    btn.replaceChildren(icon(ok ? "check" : "copy"), h("span", {}, ok ? "Copied" : "Copy failed"));
    btn.dataset.copied = ok ? "1" : "0";
    setTimeout(() => refreshActions(), FLASH_MS);
  }
}

function startEdit(msg) {
  const view = views.get(msg.id);
  if (!view) return;
  editing = msg.id;
  const area = h("textarea.edit-area", { value: msg.content, rows: 3, dataset: { testid: "edit-input" }, "aria-label": "Edit message" });
  const cancel = () => {
    editing = null;
    renderMessage(msg, view);
    refreshActions();
    view.actions.querySelector('[data-testid="message-edit"]')?.focus();
  };
  const submit = () => {
    const content = area.value;
    if (!content.trim()) return;
    const sid = currentId();
    if (!send({ type: "message.edit", session_id: sid, message_id: msg.id, content }, { type: "edit", sessionId: sid })) return;
    editing = null;
    msg.content = content;
    for (const m of state.messages.filter((m) => (m.position ?? 0) > (msg.position ?? 0))) removeMessage(m.id);
    renderMessage(msg, view);
    refreshActions();
    $("input").focus();
  };
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); cancel(); }
  });
  view.content.replaceChildren(area);
  view.actions.replaceChildren(
    h("button.btn.btn-small.btn-ghost", { type: "button", dataset: { testid: "edit-cancel" }, onclick: cancel }, "Cancel"),
    h("button.btn.btn-small.btn-primary", { type: "button", dataset: { testid: "edit-submit" }, onclick: submit }, "Save & send"));
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}

function regenerate(msg) {
  const sid = currentId();
  if (!send({ type: "message.regenerate", session_id: sid }, { type: "regenerate", sessionId: sid })) return;
  replacing = msg.id;
  views.get(msg.id)?.root.classList.add("replacing");
}

/** Click handler for the list: the Copy button of a code block. */
export async function onCodeCopy(e) {
  const btn = e.target.closest("button[data-copy='code']");
  if (!btn) return;
  const code = btn.closest(".code-block").querySelector("code").textContent;
  const ok = await copyText(code);
  btn.textContent = ok ? "Copied" : "Copy failed";
  setTimeout(() => { btn.textContent = "Copy"; }, FLASH_MS);
}

// ---- scrolling --------------------------------------------------------------------

function nearBottom() {
  const c = $("conversation");
  return c.scrollHeight - c.scrollTop - c.clientHeight < 120;
}

function scrollToBottom(force = false) {
  const c = $("conversation");
  if (force || nearBottom()) c.scrollTop = c.scrollHeight;
}
