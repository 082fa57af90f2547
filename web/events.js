// What the server says over the chat socket (docs/protocol.md), applied to the page.
import { state, emit, currentId } from "./state.js";
import { toast } from "./chrome.js";
import { settle, forgetAll } from "./commands.js";
import { findMessage, nextPosition, setMessages, addMessage, updateMessage, appendText } from "./messages.js";
import { callerOf } from "./toolcards.js";
import { upsertSession, dropSession, openCurrent, refreshSessions } from "./sessions.js";
import { restoreText } from "./composer.js";
import { afterHistory } from "./branches.js";

const ERROR_TEXT = { busy: "A reply is still being generated", overloaded: "The server is busy, try again shortly" };
const FOLLOW_AFTER_MS = 2000;

/** Apply one server event. */
export function handleEvent(ev) {
  const cmd = ev.client_id && ev.type !== "error" && ev.type !== "message.created" ? settle(ev.client_id) : undefined;
  const sid = ev.session_id;
  const isCurrent = !!sid && sid === currentId();
  switch (ev.type) {
    case "session":
      upsertSession(ev.session);
      break;
    case "history":
      if (!isCurrent) break;
      state.histories++;
      setMessages(ev.messages || []);
      if (ev.seq != null) { // a reply going on: its text up to event `seq`, the rest follows
        const live = findMessage(state.streaming.get(sid));
        if (live) live.seq = ev.seq;
      }
      afterHistory(cmd);
      break;
    case "message.created": {
      const msg = ev.message;
      if (msg.role === "assistant" && msg.status === "streaming") {
        state.streaming.set(sid, msg.id);
        if (ev.client_id) { settle(ev.client_id); state.own.add(msg.id); }
      }
      if (isCurrent) addMessage(msg);
      if (msg.role === "tool") state.calls.delete(msg.tool_call_id);
      if (isCurrent && msg.role === "tool") {
        const caller = callerOf(msg.tool_call_id);
        if (caller) updateMessage(caller); // its card shows the result
      }
      if (msg.role === "assistant") emit("sessions");
      emit("busy");
      break;
    }
    case "delta": {
      state.lastDelta = Date.now();
      if (!state.streaming.has(sid)) {
        state.streaming.set(sid, ev.message_id);
        emit("sessions");
        emit("busy");
      }
      if (!isCurrent) break;
      const msg = findMessage(ev.message_id) || addMessage({ id: ev.message_id, session_id: sid, role: "assistant",
        content: "", status: "streaming", position: nextPosition() });
      if (ev.seq != null && msg.seq != null && ev.seq <= msg.seq) break; // already in the text shown
      if (ev.seq != null) msg.seq = ev.seq;
      appendText(msg, ev.text || "");
      break;
    }
    case "tool_call": {
      if (!isCurrent) break;
      const msg = findMessage(ev.message_id);
      if (!msg) break;
      const calls = (msg.tool_calls = msg.tool_calls || []);
      if (ev.id) calls[ev.index] = { id: ev.id, type: "function", function: { name: ev.name, arguments: "" } };
      const call = calls[ev.index];
      if (call) call.function.arguments += ev.arguments || "";
      appendText(msg, ""); // drawn with the next frame
      break;
    }
    case "tool.approval": // an MCP call waits for the user's decision; its card asks (toolcards.js)
    case "tool.running":
      state.calls.set(ev.tool_call_id, { sessionId: sid, phase: ev.type === "tool.running" ? "running" : "asking" });
      if (isCurrent) {
        const caller = callerOf(ev.tool_call_id);
        if (caller) updateMessage(caller);
      }
      emit("busy");
      break;
    case "done":
      state.streaming.delete(sid);
      state.own.delete(ev.message_id);
      if (isCurrent) finish(ev);
      emit("busy");
      refreshSessions();
      break;
    case "error":
      handleError(ev);
      break;
  }
}

function finish(ev) {
  const msg = findMessage(ev.message_id);
  if (!msg) return;
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
    tool_calls: ev.tool_calls ?? null, // what the store keeps: a call cut short is not one
    error: ev.error || ev.message || msg.error,
  });
  updateMessage(msg);
}

function handleError(ev) {
  const cmd = ev.client_id ? settle(ev.client_id) : undefined;
  const sid = ev.session_id || (cmd && cmd.sessionId);
  const isCurrent = !!sid && sid === currentId();
  if (cmd && cmd.type === "cancel") return; // the reply had already finished
  if (cmd && cmd.type === "approve") { // the call no longer waits: the stored state says what became of it
    state.calls.delete(cmd.callId);
    emit("busy");
    if (isCurrent) openCurrent();
    return;
  }
  toast(errorText(ev), "error");
  if (cmd && cmd.type === "open" && ev.code === "not_found" && isCurrent) {
    dropSession(sid);
    return;
  }
  if (cmd && cmd.type === "send" && isCurrent) restoreText(cmd.content); // nothing typed is lost
  if (isCurrent && ((cmd && (cmd.type === "edit" || cmd.type === "regenerate")) || ev.message_id)) {
    openCurrent(); // undo optimistic changes / drop a reply the server refused and removed
  } else if (ev.message_id && sid) {
    state.streaming.delete(sid);
    emit("sessions");
  }
}

function errorText(ev) {
  const msg = ev.message || ERROR_TEXT[ev.code] || "Something went wrong";
  return ev.code && ev.code !== "internal" && !ev.message ? ERROR_TEXT[ev.code] || msg : msg;
}

/** The socket closed: replies go on at the server; the socket reopens the session when it reconnects and the
 * `history` it answers shows them as far as they got, then the rest streams (docs/protocol.md#resume). */
export function handleClose() {
  state.streaming.clear();
  state.calls.clear(); // reopening the session asks again for a call still awaiting approval
  state.own.clear();
  forgetAll();
  emit("busy");
  emit("sessions");
}

/** A reply started in another tab streams there only: reload its stored progress now and then. */
export function followOtherTabs() {
  const mid = state.streaming.get(currentId());
  if (mid && !state.own.has(mid) && Date.now() - state.lastDelta > FOLLOW_AFTER_MS) openCurrent();
}
