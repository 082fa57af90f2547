// Commands to the server over the chat socket, remembered by client_id until the server answers.
import { toast } from "./chrome.js";

let socket = null;
const pending = new Map(); // client_id -> {type, sessionId, content?}

/** Use this ChatSocket for every command (called once by the entry module). */
export function useSocket(s) {
  socket = s;
}

export function connected() {
  return !!socket && socket.state === "open";
}

/** Send `msg`, remembering `info` under its client_id; returns the id, or null when not connected. */
export function trySend(msg, info) {
  const cid = socket ? socket.send(msg) : null;
  if (cid) pending.set(cid, info);
  return cid;
}

/** trySend, telling the user when the socket is down. */
export function send(msg, info) {
  const cid = trySend(msg, info);
  if (!cid) warnNotConnected();
  return cid;
}

export function warnNotConnected() {
  toast("Not connected — reconnecting, try again in a moment", "error");
}

/** The command the server answered (and forget it); undefined when unknown. */
export function settle(cid) {
  const info = pending.get(cid);
  pending.delete(cid);
  return info;
}

export function forgetAll() {
  pending.clear();
}
