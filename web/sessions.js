// Sessions: which one is open (and its #/s/<id> route), creating, loading and closing them.
import { api, ApiError } from "./api.js";
import { state, emit, currentId } from "./state.js";
import { $, toast, closeSidebar } from "./chrome.js";
import { setMessages, showLoading } from "./messages.js";
import { trySend } from "./commands.js";

/** Reload the session list from the server. */
export async function refreshSessions() {
  try {
    state.sessions = await api.listSessions();
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
  if (session.id === currentId()) showSession(session);
  emit("sessions");
}

/** Forget a session the server no longer has; close it when it is open. */
export function dropSession(id) {
  state.sessions = state.sessions.filter((s) => s.id !== id);
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
