// Forge chat UI: sessions over REST, chat turns over the WebSocket (/ws).
import { api, ApiError } from "./api.js";
import { ChatSocket } from "./socket.js";
import { renderInto } from "./markdown.js";
import { h, icon, copyText } from "./dom.js";

const $ = (id) => document.getElementById(id);

const state = {
  sessions: [], // newest first
  current: null, // the open session (JSON from the server)
  messages: [], // the open session's messages, by position
  views: new Map(), // message id -> view {root, content, stats, badge, actions}
  streaming: new Map(), // session id -> id of the assistant message being generated
  pending: new Map(), // client_id -> {type, sessionId, content}
  replacing: null, // id of the assistant reply a regenerate will replace
  editing: null, // id of the user message being edited in place
  own: new Set(), // assistant replies this socket started (their deltas come to us)
  lastDelta: 0,
  dirty: new Set(),
  frame: 0,
};

// A reply started elsewhere (another tab) streams to that tab only: poll its stored state.
setInterval(() => {
  const sid = state.current && state.current.id;
  const mid = sid && state.streaming.get(sid);
  if (mid && !state.own.has(mid) && Date.now() - state.lastDelta > 2000) openCurrent();
}, 2000);

const socket = new ChatSocket(wsUrl(), {
  onOpen: () => {
    openCurrent();
    refreshSessions();
  },
  onClose: () => {
    // the server stops generations of a closed socket; the stored history tells the rest
    for (const [sid, mid] of state.streaming) {
      if (state.current && sid === state.current.id) {
        const msg = findMessage(mid);
        if (msg && msg.status === "streaming") { msg.status = "interrupted"; updateMessage(msg); }
      }
    }
    state.streaming.clear();
    state.pending.clear();
    state.own.clear();
    updateComposer();
    renderSessionList();
  },
  onEvent: handleEvent,
  onState: showConnection,
});

function wsUrl() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
}

// ---- server events ----------------------------------------------------------

function handleEvent(ev) {
  if (ev.client_id && ev.type !== "error" && ev.type !== "message.created") state.pending.delete(ev.client_id);
  const sid = ev.session_id;
  const isCurrent = !!(state.current && sid && sid === state.current.id);
  switch (ev.type) {
    case "session":
      upsertSession(ev.session);
      if (state.current && ev.session.id === state.current.id) showSession(ev.session);
      break;
    case "history":
      if (isCurrent) setMessages(ev.messages || []);
      break;
    case "message.created": {
      const msg = ev.message;
      if (msg.role === "assistant" && msg.status === "streaming") {
        state.streaming.set(sid, msg.id);
        if (ev.client_id) { state.pending.delete(ev.client_id); state.own.add(msg.id); }
      }
      if (isCurrent) addMessage(msg);
      if (msg.role === "assistant") renderSessionList();
      updateComposer();
      break;
    }
    case "delta": {
      state.lastDelta = Date.now();
      if (!state.streaming.has(sid)) { state.streaming.set(sid, ev.message_id); renderSessionList(); updateComposer(); }
      if (!isCurrent) break;
      let msg = findMessage(ev.message_id);
      if (!msg) {
        msg = { id: ev.message_id, session_id: sid, role: "assistant", content: "", status: "streaming", position: nextPosition() };
        addMessage(msg);
      }
      msg.content += ev.text || "";
      markDirty(msg.id);
      break;
    }
    case "done": {
      state.streaming.delete(sid);
      state.own.delete(ev.message_id);
      if (isCurrent) {
        const msg = findMessage(ev.message_id);
        if (msg) {
          const usage = ev.usage || {};
          const timings = ev.timings || {};
          Object.assign(msg, {
            status: ev.status || "complete",
            finish_reason: ev.finish_reason ?? null,
            prompt_tokens: usage.prompt_tokens ?? msg.prompt_tokens,
            cached_tokens: usage.cached_tokens ?? msg.cached_tokens,
            completion_tokens: usage.completion_tokens ?? msg.completion_tokens,
            ttft_ms: timings.ttft_ms ?? msg.ttft_ms,
            tokens_per_s: timings.tokens_per_s ?? msg.tokens_per_s,
            error: ev.error || ev.message || msg.error,
          });
          updateMessage(msg);
        }
      }
      updateComposer();
      refreshSessions();
      break;
    }
    case "error":
      handleError(ev);
      break;
  }
}

function handleError(ev) {
  const cmd = ev.client_id ? state.pending.get(ev.client_id) : null;
  if (ev.client_id) state.pending.delete(ev.client_id);
  const sid = ev.session_id || (cmd && cmd.sessionId);
  const isCurrent = !!(state.current && sid === state.current.id);
  if (cmd && cmd.type === "cancel") return; // the reply had already finished
  toast(errorText(ev), "error");
  if (cmd && cmd.type === "open" && ev.code === "not_found" && isCurrent) {
    state.sessions = state.sessions.filter((s) => s.id !== sid);
    renderSessionList();
    closeSession();
    return;
  }
  if (cmd && cmd.type === "send" && isCurrent && !$("input").value) {
    $("input").value = cmd.content; // give the text back so nothing typed is lost
    autosize();
  }
  if (isCurrent && ((cmd && (cmd.type === "edit" || cmd.type === "regenerate")) || ev.message_id)) {
    // undo optimistic changes / drop a reply the server refused and removed
    state.replacing = null;
    openCurrent();
  } else if (ev.message_id && sid) {
    state.streaming.delete(sid);
    renderSessionList();
  }
}

/** (Re)load the open session's stored state over the socket. */
function openCurrent() {
  if (!state.current) return false;
  const sid = state.current.id;
  const cid = socket.send({ type: "session.open", session_id: sid });
  if (cid) state.pending.set(cid, { type: "open", sessionId: sid });
  return !!cid;
}

function errorText(ev) {
  const names = { busy: "A reply is still being generated", overloaded: "The server is busy, try again shortly" };
  const msg = ev.message || names[ev.code] || "Something went wrong";
  return ev.code && ev.code !== "internal" && !ev.message ? names[ev.code] || msg : msg;
}

// ---- sessions -----------------------------------------------------------------

async function refreshSessions() {
  try {
    state.sessions = await api.listSessions();
    renderSessionList();
  } catch (err) {
    toast("Could not load sessions: " + err.message, "error");
  }
}

function upsertSession(session) {
  const i = state.sessions.findIndex((s) => s.id === session.id);
  if (i >= 0) state.sessions[i] = { ...state.sessions[i], ...session };
  else state.sessions.unshift(session);
  renderSessionList();
}

function renderSessionList() {
  const list = $("session-list");
  const focusedRename = list.querySelector("input.rename");
  if (focusedRename) return; // do not disturb an edit in progress
  const items = state.sessions.map((s) => sessionItem(s));
  if (!items.length) items.push(h("p.session-empty", {}, "No conversations yet"));
  list.replaceChildren(...items);
}

function sessionItem(s) {
  const active = state.current && state.current.id === s.id;
  const busy = state.streaming.has(s.id);
  const rename = h("button.icon-btn", { type: "button", title: "Rename", "aria-label": "Rename", dataset: { testid: "session-rename" },
    onclick: (e) => { e.stopPropagation(); startRename(item, s); } }, icon("edit"));
  const del = h("button.icon-btn.danger", { type: "button", title: "Delete", "aria-label": "Delete", dataset: { testid: "session-delete" },
    onclick: (e) => { e.stopPropagation(); confirmDelete(del, s); } }, icon("trash"));
  const item = h("div.session-item", { dataset: { testid: "session-item", id: s.id, busy: busy ? "1" : "0" }, "aria-current": active ? "page" : null },
    h("button.session-open", { type: "button", dataset: { testid: "session-open" }, onclick: () => navigate(s.id) },
      busy ? h("span.busy-dot", { title: "Generating" }) : null,
      h("span.session-name", { dataset: { testid: "session-name" } }, s.title || "Untitled")),
    h("div.session-actions", {}, rename, del));
  return item;
}

function startRename(item, s) {
  const input = h("input.rename", { value: s.title || "", maxLength: 200, dataset: { testid: "session-rename-input" }, "aria-label": "Session title" });
  let done = false;
  const finish = async (save) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    input.remove();
    if (save && title && title !== s.title) {
      try {
        const updated = await api.updateSession(s.id, { title });
        upsertSession(updated);
        if (state.current && state.current.id === s.id) showSession(updated);
      } catch (err) {
        toast("Rename failed: " + err.message, "error");
      }
    }
    renderSessionList();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); finish(true); }
    if (e.key === "Escape") { e.preventDefault(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function confirmDelete(btn, s) {
  if (btn.dataset.confirm !== "1") {
    btn.dataset.confirm = "1";
    btn.title = "Click again to delete";
    btn.closest(".session-item").classList.add("confirming");
    setTimeout(() => {
      btn.dataset.confirm = "0";
      btn.closest(".session-item")?.classList.remove("confirming");
    }, 4000);
    return;
  }
  deleteSession(s);
}

async function deleteSession(s) {
  try {
    await api.deleteSession(s.id);
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) {
      toast("Delete failed: " + err.message, "error");
      return;
    }
  }
  state.sessions = state.sessions.filter((x) => x.id !== s.id);
  if (state.current && state.current.id === s.id) closeSession();
  renderSessionList();
}

async function newSession() {
  try {
    const s = await api.createSession({ title: "New chat" });
    upsertSession(s);
    navigate(s.id);
    closeSidebar();
    $("input").focus();
    return s;
  } catch (err) {
    toast("Could not create a session: " + err.message, "error");
    return null;
  }
}

function navigate(id) {
  if (location.hash !== "#/s/" + id) history.pushState(null, "", "#/s/" + id);
  openSession(id); // synchronously sets state.current
  closeSidebar();
}

function routeId() {
  const m = /^#\/s\/([A-Za-z0-9_-]+)$/.exec(location.hash);
  return m ? m[1] : null;
}

async function openSession(id) {
  if (state.current && state.current.id === id && state.messages.length) return;
  state.current = state.sessions.find((s) => s.id === id) || { id, title: "", settings: {} };
  state.editing = null;
  state.replacing = null;
  showSession(state.current);
  setMessages([]);
  $("conversation").dataset.loading = "1";
  renderSessionList();
  if (!openCurrent()) {
    // no socket yet: show the stored history over REST; the socket re-opens it when it connects
    try {
      const full = await api.getSession(id);
      if (!state.current || state.current.id !== id) return;
      const { messages, ...session } = full;
      upsertSession(session);
      showSession(session);
      setMessages(messages || []);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        toast("That conversation no longer exists", "error");
        closeSession();
      }
    }
  }
}

function closeSession() {
  state.current = null;
  state.editing = null;
  setMessages([]);
  showSession(null);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  renderSessionList();
}

function showSession(session) {
  if (session) state.current = { ...state.current, ...session };
  const s = state.current;
  $("session-title").textContent = s ? s.title || "Untitled" : "Forge";
  document.title = s && s.title ? s.title + " · Forge" : "Forge";
  $("export-session").disabled = !s;
  $("toggle-settings").disabled = !s;
  if (!s) toggleSettings(false);
  if (s && !$("settings").hidden && !$("settings").contains(document.activeElement)) fillSettings();
  updateComposer();
}

// ---- messages -----------------------------------------------------------------

function findMessage(id) {
  return state.messages.find((m) => m.id === id);
}

function nextPosition() {
  return state.messages.length ? Math.max(...state.messages.map((m) => m.position ?? 0)) + 1 : 0;
}

function setMessages(messages) {
  delete $("conversation").dataset.loading;
  state.messages = messages.map((m) => ({ ...m })).sort((a, b) => (a.position ?? 0) - (b.position ?? 0));
  state.views.clear();
  state.dirty.clear();
  const sid = state.current && state.current.id;
  const live = state.messages.find((m) => m.status === "streaming" && m.role === "assistant");
  if (sid) {
    if (live) state.streaming.set(sid, live.id);
    else state.streaming.delete(sid);
  }
  $("messages").replaceChildren(...state.messages.map((m) => messageView(m).root));
  refreshActions();
  updateComposer();
  scrollToBottom(true);
}

function addMessage(msg) {
  const existing = findMessage(msg.id);
  if (existing) {
    Object.assign(existing, msg);
    updateMessage(existing);
    return;
  }
  // a new message at position P replaces whatever the server deleted from P on
  const doomed = state.messages.filter((m) => (m.position ?? 0) >= (msg.position ?? Infinity) || m.id === state.replacing);
  for (const m of doomed) removeMessage(m.id);
  if (msg.role === "assistant") state.replacing = null;
  const copy = { ...msg };
  state.messages.push(copy);
  state.messages.sort((a, b) => (a.position ?? 0) - (b.position ?? 0));
  const view = messageView(copy);
  const after = state.messages[state.messages.indexOf(copy) + 1];
  const before = after && state.views.get(after.id);
  $("messages").insertBefore(view.root, before ? before.root : null);
  refreshActions();
  scrollToBottom(true);
}

function removeMessage(id) {
  const view = state.views.get(id);
  if (view) view.root.remove();
  state.views.delete(id);
  state.messages = state.messages.filter((m) => m.id !== id);
}

const ROLE_LABEL = { user: "You", assistant: "Forge", system: "System" };

function messageView(msg) {
  const content = h("div.msg-content", { dataset: { testid: "message-content" } });
  const stats = h("div.msg-stats", { dataset: { testid: "message-stats" } });
  const badge = h("span.badge", { dataset: { testid: "message-status" } });
  const actions = h("div.msg-actions");
  const root = h("article.msg", { dataset: { testid: "message", role: msg.role, id: msg.id } },
    h("div.msg-role", {}, ROLE_LABEL[msg.role] || msg.role, badge),
    content,
    h("div.msg-foot", {}, stats, actions));
  root.classList.add("msg-" + (ROLE_LABEL[msg.role] ? msg.role : "other"));
  const view = { root, content, stats, badge, actions };
  state.views.set(msg.id, view);
  renderMessage(msg, view);
  return view;
}

function renderMessage(msg, view) {
  view.root.dataset.status = msg.status || "complete";
  if (msg.role === "assistant") {
    renderAssistant(msg, view);
  } else {
    view.content.textContent = msg.content || "";
  }
  renderBadge(msg, view);
  renderStats(msg, view);
}

function renderAssistant(msg, view) {
  view.content.querySelector(".caret")?.remove(); // renderInto keeps unchanged blocks, and the caret in them
  renderInto(view.content, msg.content || "");
  if (msg.status !== "streaming") return;
  if (!msg.content) {
    view.content.replaceChildren(h("span.typing", { "aria-label": "Generating" }, h("i"), h("i"), h("i")));
    return;
  }
  // put the caret at the end of the innermost last block, so it follows the text
  let target = view.content;
  for (;;) {
    const last = target.lastElementChild;
    if (!last || !/^(P|H[1-6]|UL|OL|LI|BLOCKQUOTE|PRE|CODE|DIV|TABLE|THEAD|TBODY|TR|TD|TH)$/.test(last.tagName)) break;
    target = last.classList.contains("code-block") ? last.querySelector("code") : last;
  }
  target.appendChild(h("span.caret", { "aria-hidden": "true" }));
}

function renderBadge(msg, view) {
  const labels = { stopped: "Stopped", error: "Error", interrupted: "Interrupted" };
  let text = labels[msg.status] || "";
  if (msg.status === "complete" && msg.finish_reason === "length") text = "Max tokens reached";
  if (msg.status === "error" && msg.error) text = "Error: " + msg.error;
  view.badge.textContent = text;
  view.badge.hidden = !text;
  view.badge.className = "badge" + (msg.status === "error" ? " badge-error" : "");
}

function renderStats(msg, view) {
  const parts = [];
  const stat = (name, text, title) => h("span.stat", { dataset: { stat: name }, title }, text);
  if (msg.role === "assistant" && msg.status !== "streaming") {
    if (msg.completion_tokens != null) parts.push(stat("tokens", msg.completion_tokens + " tokens", "Generated tokens"));
    if (msg.tokens_per_s != null) parts.push(stat("tokens-per-s", Number(msg.tokens_per_s).toFixed(1) + " tok/s", "Decode speed"));
    if (msg.cached_tokens != null) {
      const of = msg.prompt_tokens != null ? " / " + msg.prompt_tokens : "";
      parts.push(stat("cached", msg.cached_tokens + of + " cached", "Prompt tokens served from the prefix cache / prompt tokens"));
    }
    if (msg.ttft_ms != null) parts.push(stat("ttft", "TTFT " + Math.round(msg.ttft_ms) + " ms", "Time to first token"));
  }
  view.stats.replaceChildren(...parts.flatMap((p, i) => (i ? [h("span.sep", {}, "·"), p] : [p])));
}

function updateMessage(msg) {
  const view = state.views.get(msg.id);
  if (!view) return;
  state.dirty.delete(msg.id);
  const stick = nearBottom();
  renderMessage(msg, view);
  refreshActions();
  if (stick) scrollToBottom();
}

function markDirty(id) {
  state.dirty.add(id);
  if (!state.frame) state.frame = requestAnimationFrame(flushDirty);
}

function flushDirty() {
  state.frame = 0;
  const stick = nearBottom();
  for (const id of state.dirty) {
    const msg = findMessage(id);
    const view = state.views.get(id);
    if (msg && view) renderAssistant(msg, view);
  }
  state.dirty.clear();
  if (stick) scrollToBottom();
}

function refreshActions() {
  const sid = state.current && state.current.id;
  const busy = !!(sid && state.streaming.has(sid));
  const lastAssistant = [...state.messages].reverse().find((m) => m.role === "assistant");
  for (const msg of state.messages) {
    const view = state.views.get(msg.id);
    if (!view || state.editing === msg.id) continue;
    if (msg.status === "streaming") { view.actions.replaceChildren(); continue; }
    const buttons = [actionButton("copy", "Copy", "message-copy", () => copyMessage(msg, view))];
    if (msg.role === "user") buttons.push(actionButton("edit", "Edit", "message-edit", () => startEdit(msg), busy));
    if (lastAssistant && msg.id === lastAssistant.id && msg.status !== "streaming") {
      buttons.push(actionButton("regen", "Regenerate", "message-regenerate", () => regenerate(msg), busy));
    }
    view.actions.replaceChildren(...buttons);
  }
}

function actionButton(iconName, label, testid, onclick, disabled = false) {
  return h("button.action", { type: "button", title: label, disabled, dataset: { testid }, onclick }, icon(iconName), h("span", {}, label));
}

async function copyMessage(msg, view) {
  const ok = await copyText(msg.content || "");
  const btn = view.actions.querySelector('[data-testid="message-copy"]');
  if (btn) {
    btn.replaceChildren(icon(ok ? "check" : "copy"), h("span", {}, ok ? "Copied" : "Copy failed"));
    btn.dataset.copied = ok ? "1" : "0";
    setTimeout(() => refreshActions(), 1500);
  }
}

function startEdit(msg) {
  const view = state.views.get(msg.id);
  if (!view) return;
  state.editing = msg.id;
  const area = h("textarea.edit-area", { value: msg.content, rows: 3, dataset: { testid: "edit-input" }, "aria-label": "Edit message" });
  const cancel = () => { state.editing = null; renderMessage(msg, view); refreshActions(); };
  const submit = () => {
    const content = area.value;
    if (!content.trim()) return;
    const sid = state.current.id;
    const cid = socket.send({ type: "message.edit", session_id: sid, message_id: msg.id, content });
    if (!cid) { toast("Not connected — reconnecting, try again in a moment", "error"); return; }
    state.pending.set(cid, { type: "edit", sessionId: sid });
    state.editing = null;
    msg.content = content;
    for (const m of state.messages.filter((m) => (m.position ?? 0) > (msg.position ?? 0))) removeMessage(m.id);
    renderMessage(msg, view);
    refreshActions();
  };
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
    if (e.key === "Escape") { e.preventDefault(); cancel(); }
  });
  view.content.replaceChildren(area);
  view.actions.replaceChildren(
    h("button.btn.btn-small.btn-ghost", { type: "button", dataset: { testid: "edit-cancel" }, onclick: cancel }, "Cancel"),
    h("button.btn.btn-small.btn-primary", { type: "button", dataset: { testid: "edit-submit" }, onclick: submit }, "Save & send"));
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}

function regenerate(msg) {
  const sid = state.current.id;
  const cid = socket.send({ type: "message.regenerate", session_id: sid });
  if (!cid) { toast("Not connected — reconnecting, try again in a moment", "error"); return; }
  state.pending.set(cid, { type: "regenerate", sessionId: sid });
  state.replacing = msg.id;
  state.views.get(msg.id)?.root.classList.add("replacing");
}

// ---- composer -------------------------------------------------------------------

async function send() {
  const input = $("input");
  const content = input.value;
  if (!content.trim()) return;
  if (state.current && state.streaming.has(state.current.id)) return;
  if (socket.state !== "open") { toast("Not connected — reconnecting, try again in a moment", "error"); return; }
  if (!state.current) {
    const s = await newSession();
    if (!s) return;
  }
  const sid = state.current.id;
  const cid = socket.send({ type: "message.send", session_id: sid, content });
  if (!cid) { toast("Not connected — reconnecting, try again in a moment", "error"); return; }
  state.pending.set(cid, { type: "send", sessionId: sid, content });
  input.value = "";
  autosize();
}

function stop() {
  if (!state.current) return;
  const sid = state.current.id;
  const cid = socket.send({ type: "generation.cancel", session_id: sid });
  if (cid) state.pending.set(cid, { type: "cancel", sessionId: sid });
}

function updateComposer() {
  const busy = !!(state.current && state.streaming.has(state.current.id));
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("composer").dataset.busy = busy ? "1" : "0";
  $("empty-state").hidden = !!(state.current && state.messages.length) || $("conversation").dataset.loading === "1";
  refreshActions();
}

function autosize() {
  const input = $("input");
  input.style.height = "auto";
  input.style.height = Math.min(input.scrollHeight, 240) + "px";
}

function nearBottom() {
  const c = $("conversation");
  return c.scrollHeight - c.scrollTop - c.clientHeight < 120;
}

function scrollToBottom(force = false) {
  const c = $("conversation");
  if (force || nearBottom()) c.scrollTop = c.scrollHeight;
}

// ---- settings, export, import ------------------------------------------------------

function toggleSettings(open) {
  const panel = $("settings");
  const show = open ?? panel.hidden;
  panel.hidden = !show;
  $("toggle-settings").setAttribute("aria-expanded", String(show));
  if (show) fillSettings();
}

function fillSettings() {
  const s = state.current || {};
  const st = s.settings || {};
  $("set-system").value = s.system_prompt || "";
  $("set-temperature").value = st.temperature ?? 0.7;
  $("temp-out").textContent = Number($("set-temperature").value).toFixed(2);
  $("set-top-p").value = st.top_p ?? 1;
  $("set-max-tokens").value = st.max_tokens ?? 512;
  $("settings-error").textContent = "";
  $("settings-saved").hidden = true;
}

async function saveSettings(e) {
  e.preventDefault();
  if (!state.current) return;
  const err = $("settings-error");
  const temperature = Number($("set-temperature").value);
  const topP = Number($("set-top-p").value);
  const maxTokens = Number($("set-max-tokens").value);
  if (!Number.isFinite(topP) || topP <= 0 || topP > 1) { err.textContent = "Top p must be a number in (0, 1]."; return; }
  if (!Number.isInteger(maxTokens) || maxTokens < 1) { err.textContent = "Max tokens must be a whole number of at least 1."; return; }
  const system = $("set-system").value;
  try {
    const updated = await api.updateSession(state.current.id, {
      system_prompt: system.trim() ? system : null,
      settings: { temperature, top_p: topP, max_tokens: maxTokens },
    });
    upsertSession(updated);
    showSession(updated);
    err.textContent = "";
    $("settings-saved").hidden = false;
    setTimeout(() => { $("settings-saved").hidden = true; }, 2000);
  } catch (error) {
    err.textContent = error.message;
  }
}

async function exportSession() {
  if (!state.current) return;
  try {
    const data = await api.exportSession(state.current.id);
    const blob = new Blob([JSON.stringify(data, null, 2)], { type: "application/json" });
    const slug = (state.current.title || "session").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 40) || "session";
    const a = h("a", { href: URL.createObjectURL(blob), download: "forge-" + slug + ".json" });
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  } catch (err) {
    toast("Export failed: " + err.message, "error");
  }
}

async function importFile(file) {
  let data;
  try {
    data = JSON.parse(await file.text());
  } catch {
    toast(file.name + " is not a JSON export", "error");
    return;
  }
  try {
    const s = await api.importSession(data);
    upsertSession(s);
    navigate(s.id);
    toast("Imported “" + (s.title || "session") + "”");
  } catch (err) {
    toast("Import failed: " + err.message, "error");
  }
}

// ---- chrome ----------------------------------------------------------------------

function showConnection(st, info) {
  const el = $("conn-status");
  el.dataset.state = st;
  el.querySelector(".conn-text").textContent = st === "open" ? "Connected" : st === "connecting" ? "Connecting…" : "Reconnecting…";
  el.title = st === "reconnecting" && info && info.retryInMs ? "Next attempt in " + Math.max(1, Math.round(info.retryInMs / 1000)) + " s" : "";
}

function toast(text, kind = "info") {
  const t = h("div.toast", { role: kind === "error" ? "alert" : "status", dataset: { testid: "toast", kind } }, text);
  $("toasts").appendChild(t);
  setTimeout(() => t.classList.add("leaving"), 5000);
  setTimeout(() => t.remove(), 5400);
}

function openSidebar() { $("layout").classList.add("sidebar-open"); }
function closeSidebar() { $("layout").classList.remove("sidebar-open"); }

function init() {
  $("open-sidebar").append(icon("menu"));
  $("close-sidebar").append(icon("close"));
  $("close-settings").append(icon("close"));
  $("send").append(icon("send"));
  $("stop").append(icon("stop"));
  $("new-session").prepend(icon("plus"));
  $("export-session").prepend(icon("download"));
  $("toggle-settings").prepend(icon("settings"));
  $("import-session").prepend(icon("upload"));

  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    if (e.key === "Escape" && state.current && state.streaming.has(state.current.id)) { e.preventDefault(); stop(); }
  });
  $("input").addEventListener("input", autosize);
  $("stop").addEventListener("click", stop);
  $("new-session").addEventListener("click", newSession);
  $("toggle-settings").addEventListener("click", () => toggleSettings());
  $("close-settings").addEventListener("click", () => toggleSettings(false));
  $("settings-form").addEventListener("submit", saveSettings);
  $("set-temperature").addEventListener("input", () => { $("temp-out").textContent = Number($("set-temperature").value).toFixed(2); });
  $("export-session").addEventListener("click", exportSession);
  $("import-session").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (e) => {
    const f = e.target.files && e.target.files[0];
    if (f) importFile(f);
    e.target.value = "";
  });
  $("open-sidebar").addEventListener("click", openSidebar);
  $("close-sidebar").addEventListener("click", closeSidebar);
  $("scrim").addEventListener("click", closeSidebar);
  $("messages").addEventListener("click", async (e) => {
    const btn = e.target.closest("button[data-copy='code']");
    if (!btn) return;
    const code = btn.closest(".code-block").querySelector("code").textContent;
    const ok = await copyText(code);
    btn.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { btn.textContent = "Copy"; }, 1500);
  });
  window.addEventListener("hashchange", () => {
    const id = routeId();
    if (id) openSession(id);
    else closeSession();
  });

  updateComposer();
  refreshSessions().then(() => {
    const id = routeId();
    if (id) openSession(id);
  });
}

init();
