// A WebSocket that reconnects with jittered exponential backoff and notices dead links.
import { ensureAccess, wsProtocols } from "./auth.js";

const PING_EVERY_MS = 15000;
const DEAD_AFTER_MS = 40000;

/**
 * new ChatSocket(url, {onOpen, onEvent, onState}) ; .send(obj) -> bool ; .state
 * state: "connecting" | "open" | "reconnecting" ; onState(state, info) where info.retryInMs is set while waiting.
 */
export class ChatSocket {
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.ws = null;
    this.attempt = 0;
    this.state = "connecting";
    this.retryTimer = null;
    this.pingTimer = null;
    this.lastSeen = 0;
    this.seq = 0;
    this.connect();
    window.addEventListener("online", () => this.reconnectNow());
  }

  async connect() {
    clearTimeout(this.retryTimer);
    this.setState(this.attempt ? "reconnecting" : "connecting", {});
    await ensureAccess(); // a server with keys refuses the handshake without one
    let ws;
    try {
      // Behind HAProxy the open session in the URL sends the socket to the replica holding its prefix cache.
      const sid = /^#\/s\/([A-Za-z0-9_-]+)$/.exec(location.hash)?.[1];
      ws = new WebSocket(sid ? `${this.url}?session=${sid}` : this.url, wsProtocols());
    } catch {
      this.scheduleRetry();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      this.lastSeen = Date.now();
      this.setState("open", {});
      clearInterval(this.pingTimer);
      this.pingTimer = setInterval(() => this.heartbeat(), PING_EVERY_MS);
      this.handlers.onOpen?.();
    };
    ws.onmessage = (ev) => {
      this.lastSeen = Date.now();
      let data;
      try { data = JSON.parse(ev.data); } catch { return; }
      if (data && data.type !== "pong") this.handlers.onEvent?.(data);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      clearInterval(this.pingTimer);
      this.handlers.onClose?.();
      this.scheduleRetry();
    };
    ws.onerror = () => {};
  }

  heartbeat() {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    if (Date.now() - this.lastSeen > DEAD_AFTER_MS) {
      this.ws.close();
      return;
    }
    this.ws.send(JSON.stringify({ type: "ping" }));
  }

  scheduleRetry() {
    const base = Math.min(10000, 500 * 2 ** this.attempt);
    const delay = Math.round(base * (0.8 + Math.random() * 0.4));
    this.attempt++;
    this.setState("reconnecting", { retryInMs: delay });
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  reconnectNow() {
    if (this.ws) return;
    this.connect();
  }

  setState(state, info) {
    this.state = state;
    this.handlers.onState?.(state, info);
  }

  /** Send a command; returns its client_id, or null when the socket is not open. */
  send(obj) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return null;
    const clientId = "c" + ++this.seq;
    this.ws.send(JSON.stringify({ ...obj, client_id: clientId }));
    return clientId;
  }
}
