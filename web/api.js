// REST calls for sessions. Errors surface as ApiError with the server's message.
import { authHeaders, ensureAccess, keyRefused } from "./auth.js";

export class ApiError extends Error {
  constructor(message, status, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

async function request(method, path, body) {
  await ensureAccess();
  const init = { method, headers: authHeaders() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    throw new ApiError("The server is unreachable (" + err.message + ")", 0);
  }
  if (res.status === 401) {
    await keyRefused();
    return request(method, path, body);
  }
  if (res.status === 204) return null;
  let data = null;
  try { data = await res.json(); } catch { data = null; }
  if (!res.ok) {
    const e = data && data.error;
    const msg = (e && e.message) || (data && data.detail) || res.status + " " + res.statusText;
    throw new ApiError(msg, res.status, e && e.param);
  }
  return data;
}

export const api = {
  listSessions: () => request("GET", "/api/sessions").then((d) => d.data),
  createSession: (body = {}) => request("POST", "/api/sessions", body),
  getSession: (id) => request("GET", "/api/sessions/" + encodeURIComponent(id)),
  updateSession: (id, patch) => request("PATCH", "/api/sessions/" + encodeURIComponent(id), patch),
  deleteSession: (id) => request("DELETE", "/api/sessions/" + encodeURIComponent(id)),
  exportSession: (id) => request("GET", "/api/sessions/" + encodeURIComponent(id) + "/export"),
  importSession: (data) => request("POST", "/api/sessions/import", data),
  mcpTools: () => request("GET", "/api/mcp/tools").then((d) => d.data),
  listModels: () => request("GET", "/v1/models").then((d) => d.data),
  search: (q) => request("GET", "/api/search?q=" + encodeURIComponent(q)).then((d) => d.data),
};
