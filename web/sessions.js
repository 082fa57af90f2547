// Sessions: which one is open (and its #/s/<id> route), creating, loading and closing them.
import { api, ApiError } from "./api.js";
import { state, emit, currentId } from "./state.js";
import { $, toast, closeSidebar } from "./chrome.js";
import { setMessages, showLoading } from "./messages.js";
import { trySend } from "./commands.js";

// A list answer can arrive after sessions were made or deleted here (the server read it before): those changes,
// newer than the request, are kept on top of it, and an answer older than the one shown is dropped.
let changes = 0; // sessions added, updated or dropped here so far
const changed = new Map(); // session id -> {at: its change's number, session: the session, or null once dropped}
let listsAsked = 0;
let listShown = 0; // the latest list request whose answer the page shows

/** Reload the session list from the server. */
export async function refreshSessions() {
  const asked = ++listsAsked;
  const since = changes;
  try {
    const sessions = await api.listSessions();
    if (asked < listShown) return; // a newer answer is already shown
    listShown = asked;
    for (const [id, { at, session }] of changed) {
      if (at <= since) { changed.delete(id); continue; } // the server had it before it read the list
      const i = sessions.findIndex((s) => s.id === id);
      if (!session) { if (i >= 0) sessions.splice(i, 1); }
      else if (i < 0) sessions.unshift(session);
    }
    state.sessions = sessions;
    emit("sessions");
  } catch (err) {
    toast("Could not load sessions: " + err.message, "error");
  }
}

/** Add or update one session in the list (and in the title bar when it is the open one). */
export function upsertSession(session) {
  const i = state.sessions.findIndex((s) => s.id === session.id);
  if (i >= 0) state.sessions[i] = { ...state.sessions[i], ...session };
  else state.sessions.unshift(session);
  changed.set(session.id, { at: ++changes, session: state.sessions[i >= 0 ? i : 0] });
  if (session.id === currentId()) showSession(session);
  emit("sessions");
}

/** Forget a session the server no longer has; close it when it is open. */
export function dropSession(id) {
  state.sessions = state.sessions.filter((s) => s.id !== id);
  changed.set(id, { at: ++changes, session: null });
  if (id === currentId()) closeSession();
  emit("sessions");
}

export async function newSession() {
  try {
    // MCP calls in this UI's sessions wait for the user's approval (docs/mcp.md#approval)
    const s = await api.createSession({ title: "New chat", settings: { mcp_approval: true } });
    upsertSession(s);
    navigate(s.id);
    $("input").focus();
    return s;
  } catch (err) {
    toast("Could not create a session: " + err.message, "error");
    return null;
  }
}

/** Open session `id` and put it in the address bar. */
export function navigate(id) {
  if (location.hash !== "#/s/" + id) history.pushState(null, "", "#/s/" + id);
  openSession(id); // synchronously sets state.current
  closeSidebar();
}

/** The session id in the address bar, or null. */
export function routeId() {
  const m = /^#\/s\/([A-Za-z0-9_-]+)$/.exec(location.hash);
  return m ? m[1] : null;
}

export async function openSession(id) {
  if (currentId() === id && state.messages.length) return;
  state.current = state.sessions.find((s) => s.id === id) || { id, title: "", settings: {} };
  showSession(state.current);
  showLoading();
  emit("sessions");
  if (openCurrent()) return;
  // no socket yet: show the stored history over REST; the socket re-opens it when it connects
  const histories = state.histories;
  try {
    const { messages, ...session } = await api.getSession(id);
    if (currentId() !== id) return;
    upsertSession(session);
    // the socket's history, if it came first, is newer: a reply going on is there as far as it got, and its
    // deltas follow from there (the stored copy may be a few flushes behind)
    if (state.histories === histories) setMessages(messages || []);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      toast("That conversation no longer exists", "error");
      closeSession();
    }
  }
}

/** (Re)load the open session's stored state over the socket; false when it is not connected. */
export function openCurrent() {
  const sid = currentId();
  return !!sid && !!trySend({ type: "session.open", session_id: sid }, { type: "open", sessionId: sid });
}

export function closeSession() {
  state.current = null;
  setMessages([]);
  showSession(null);
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  emit("sessions");
}

/** Merge `session`'s fields into the open session and show them. */
function showSession(session) {
  if (session) state.current = { ...state.current, ...session };
  const s = state.current;
  $("session-title").textContent = s ? s.title || "Untitled" : "Forge";
  document.title = s && s.title ? s.title + " · Forge" : "Forge";
  $("export-session").disabled = !s;
  $("toggle-settings").disabled = !s;
  emit("session");
}
