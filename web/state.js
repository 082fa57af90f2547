// What the chat page knows, and change notifications: a module that changes something others
// show emits a topic; the entry module (app.js) decides who redraws on which topic.
//   "sessions": the session list or a session's busy state changed (the sidebar redraws)
//   "session":  the open session or its fields changed (title bar, settings drawer)
//   "busy":     a reply started or finished in the open session (composer, message actions)

export const state = {
  sessions: [], // newest first
  current: null, // the open session (JSON from the server)
  messages: [], // the open session's messages, by position
  streaming: new Map(), // session id -> id of the assistant message being generated
  own: new Set(), // assistant replies this socket started (their deltas come to us)
  lastDelta: 0, // when the last delta arrived (ms since the epoch)
  histories: 0, // `history` events applied: a REST copy fetched before the latest one is older than it
  calls: new Map(), // tool_call_id -> {sessionId, phase: "asking" | "answered" | "denied" | "running"}: MCP calls in a round
};

const listeners = new Map();

/** Call `fn` whenever `topic` is emitted. */
export function on(topic, fn) {
  if (!listeners.has(topic)) listeners.set(topic, []);
  listeners.get(topic).push(fn);
}

export function emit(topic) {
  for (const fn of listeners.get(topic) || []) fn();
}

/** The open session's id, or null. */
export function currentId() {
  return state.current ? state.current.id : null;
}

/** Whether a reply is being generated, or an MCP call runs or awaits approval, in session `sid` (default: the open
 * one): Stop applies to all of them. */
export function isBusy(sid = currentId()) {
  return !!(sid && (state.streaming.has(sid) || [...state.calls.values()].some((c) => c.sessionId === sid)));
}
