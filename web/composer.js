// The composer: type a message, Enter sends, Escape (or the Stop button) stops the reply.
import { state, currentId, isBusy } from "./state.js";
import { $ } from "./chrome.js";
import { connected, send as sendCommand, warnNotConnected } from "./commands.js";
import { newSession } from "./sessions.js";

const MAX_HEIGHT_PX = 240;

export async function send() {
  const input = $("input");
  const content = input.value;
  if (!content.trim() || isBusy()) return;
  if (!connected()) { warnNotConnected(); return; }
  if (!state.current && !(await newSession())) return;
  const sid = currentId();
  if (!sendCommand({ type: "message.send", session_id: sid, content }, { type: "send", sessionId: sid, content })) return;
  input.value = "";
  autosize();
}

export function stop() {
  const sid = currentId();
  if (sid) sendCommand({ type: "generation.cancel", session_id: sid }, { type: "cancel", sessionId: sid });
}

/** Give back the text of a message the server refused, unless something new was typed. */
export function restoreText(content) {
  const input = $("input");
  if (input.value) return;
  input.value = content;
  autosize();
}

/** Show Send or Stop for the open session; keep focus in the composer when the button it was on goes. */
export function showBusy() {
  const busy = isBusy();
  const hiding = $(busy ? "send" : "stop");
  const hadFocus = document.activeElement === hiding;
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("composer").dataset.busy = busy ? "1" : "0";
  if (hadFocus) $(busy ? "stop" : "send").focus();
}

export function onKeydown(e) {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  if (e.key === "Escape" && isBusy()) { e.preventDefault(); e.stopPropagation(); stop(); }
}

export function autosize() {
  const input = $("input");
  input.style.height = "auto";
  input.style.height = Math.min(input.scrollHeight, MAX_HEIGHT_PX) + "px";
}
