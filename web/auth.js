// The API key, asked for once when the server has keys and kept for this tab (sessionStorage).
// REST calls send it as "Authorization: Bearer <key>"; the WebSocket, which cannot carry headers from a
// browser, offers it as the subprotocol "forge.bearer.<base64url key>" next to "forge".
import { h } from "./dom.js";

const STORE = "forge-api-key";
let pending = null; // the running ensureAccess(), shared by every caller
let confirmed = false; // requests went through since the last refusal

export function authHeaders() {
  const key = sessionStorage.getItem(STORE);
  return key ? { Authorization: "Bearer " + key } : {};
}

export function wsProtocols() {
  const key = sessionStorage.getItem(STORE);
  if (!key) return undefined;
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(key)));
  return ["forge", "forge.bearer." + b64.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")];
}

/** The stored key was refused: forget it and ask again. */
export function keyRefused() {
  sessionStorage.removeItem(STORE);
  confirmed = false;
  return ensureAccess("That key was not accepted.");
}

/** Resolves once requests are allowed: no key needed, or a key the server accepts is stored. */
export function ensureAccess(problem = "") {
  if (confirmed && !problem) return Promise.resolve();
  if (!pending) pending = probe(problem).then(() => { confirmed = true; }).finally(() => { pending = null; });
  return pending;
}

async function probe(problem) {
  if (!problem && await accepted(authHeaders())) return;
  for (;;) {
    const key = await askForKey(problem);
    if (!/^[\x21-\x7e]+$/.test(key)) {
      problem = "An API key is printable ASCII without spaces.";
      continue;
    }
    if (await accepted({ Authorization: "Bearer " + key })) {
      sessionStorage.setItem(STORE, key);
      return;
    }
    problem = "That key was not accepted.";
  }
}

async function accepted(headers) {
  try {
    const res = await fetch("/api/sessions", { headers, cache: "no-store" });
    return res.status !== 401;
  } catch {
    return true; // unreachable: the callers report that themselves
  }
}

function askForKey(problem) {
  return new Promise((resolve) => {
    const input = h("input", { type: "password", autocomplete: "off", required: true,
      dataset: { testid: "auth-key" }, "aria-label": "API key" });
    const error = h("p.field-error", { role: "alert", dataset: { testid: "auth-error" } }, problem);
    const form = h("form", { method: "dialog" },
      h("h2", {}, "API key"),
      h("p", {}, "This server needs an API key. It is kept for this tab only."),
      h("label.field", {}, input), error,
      h("div.settings-actions", {}, h("button.btn.btn-primary", { type: "submit", dataset: { testid: "auth-submit" } }, "Continue")));
    const dialog = h("dialog.auth", { dataset: { testid: "auth-dialog" } }, form);
    dialog.addEventListener("cancel", (e) => e.preventDefault()); // nothing works without a key
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      dialog.close();
      dialog.remove();
      resolve(key);
    });
    document.body.append(dialog);
    dialog.showModal();
    input.focus();
  });
}
