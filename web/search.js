// Search from the sidebar: titles and message text of the open key's sessions (GET /api/search). While a
// query is typed the hits replace the session list; choosing one opens its session at that message.
import { api } from "./api.js";
import { $, toast } from "./chrome.js";
import { h } from "./dom.js";
import { navigate } from "./sessions.js";
import { goTo } from "./branches.js";

const DEBOUNCE_MS = 200;
const ROLE = { user: "You", assistant: "Forge", system: "System" };

let timer = null;
let asked = 0; // the latest query's number: older answers are dropped

/** The query changed: search a moment after typing stops. */
export function onSearchInput() {
  clearTimeout(timer);
  const q = $("search-input").value.trim();
  if (!q) { clearSearch(false); return; }
  timer = setTimeout(() => run(q), DEBOUNCE_MS);
}

/** Enter: search now and move to the first hit. */
export async function onSearchSubmit(e) {
  e.preventDefault();
  clearTimeout(timer);
  const q = $("search-input").value.trim();
  if (q && (await run(q))) $("search-results").querySelector("button")?.focus();
}

/** Escape in the box clears the search (and stops there); an empty box lets Escape close the drawer. */
export function onSearchKeydown(e) {
  if (e.key !== "Escape" || !$("search-input").value) return;
  e.preventDefault();
  e.stopPropagation();
  clearSearch(true);
}

function clearSearch(emptyBox) {
  asked++;
  if (emptyBox) $("search-input").value = "";
  $("search-results").hidden = true;
  $("search-results").replaceChildren();
  $("search-status").hidden = true;
  $("session-list").hidden = false;
}

async function run(q) {
  const n = ++asked;
  let hits;
  try {
    hits = await api.search(q);
  } catch (err) {
    if (n === asked) toast("Search failed: " + err.message, "error");
    return false;
  }
  if (n !== asked) return false;
  $("search-results").replaceChildren(...hits.map(hitItem));
  $("search-results").hidden = !hits.length;
  $("session-list").hidden = true;
  $("search-status").hidden = false;
  $("search-status").dataset.query = q;
  $("search-status").textContent = hits.length ? hits.length + (hits.length === 1 ? " match" : " matches") : "No matches";
  return hits.length > 0;
}

function hitItem(hit) {
  const where = hit.message ? ROLE[hit.message.role] || hit.message.role : "Title";
  return h("button.search-hit", { type: "button", dataset: { testid: "search-hit", sessionId: hit.session.id,
    messageId: hit.message ? hit.message.id : "" }, onclick: () => open(hit) },
    h("span.hit-title", {}, hit.session.title || "Untitled"),
    h("span.hit-text", {}, h("span.hit-where", {}, where + ": "), ...marked(hit.snippet, hit.highlights)));
}

/** The snippet as text nodes, its matches in <mark>. */
function marked(text, ranges) {
  const parts = [];
  let at = 0;
  for (const [start, end] of ranges) {
    if (start < at) continue;
    parts.push(text.slice(at, start), h("mark", {}, text.slice(start, end)));
    at = end;
  }
  parts.push(text.slice(at));
  return parts.filter((p) => p !== "");
}

function open(hit) {
  if (hit.message) goTo(hit.session.id, hit.message.id, navigate);
  else navigate(hit.session.id);
}
