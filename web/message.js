// One message's view: role, content (Markdown for replies, text otherwise), status badge, stats.
import { h } from "./dom.js";
import { renderInto } from "./markdown.js";
import { toolCards } from "./toolcards.js";

const ROLE_LABEL = { user: "You", assistant: "Forge", system: "System", tool: "Tool" };
const BADGES = { stopped: "Stopped", error: "Error", interrupted: "Interrupted" };
const CARET_HOSTS = /^(P|H[1-6]|UL|OL|LI|BLOCKQUOTE|PRE|CODE|DIV|TABLE|THEAD|TBODY|TR|TD|TH)$/;

/**
 * @typedef {{root: HTMLElement, content: HTMLElement, stats: HTMLElement, badge: HTMLElement, branches: HTMLElement,
 *            actions: HTMLElement}} View
 */

/** Build the elements of `msg` and render it; returns its View. */
export function messageView(msg) {
  const content = h("div.msg-content", { dataset: { testid: "message-content" } });
  const stats = h("div.msg-stats", { dataset: { testid: "message-stats" } });
  const badge = h("span.badge", { dataset: { testid: "message-status" } });
  const branches = h("div.msg-branches");
  const actions = h("div.msg-actions");
  const label = ROLE_LABEL[msg.role] || msg.role;
  const root = h("article.msg", { dataset: { testid: "message", role: msg.role, id: msg.id, position: msg.position },
    "aria-label": label },
    h("div.msg-role", {}, label, badge),
    content,
    h("div.msg-foot", {}, branches, stats, actions));
  root.classList.add("msg-" + (ROLE_LABEL[msg.role] ? msg.role : "other"));
  // a tool result shows in the card of the call it answers (toolcards.js)
  if (msg.role === "tool") root.hidden = true;
  const view = { root, content, stats, badge, branches, actions };
  renderMessage(msg, view);
  return view;
}

/** Redraw everything of `msg` except its branch switch and actions. */
export function renderMessage(msg, view) {
  view.root.dataset.status = msg.status || "complete";
  renderBody(msg, view);
  renderBadge(msg, view);
  renderStats(msg, view);
}

/** Redraw the content; a streaming reply gets a caret at the end of its text. */
export function renderBody(msg, view) {
  if (msg.role !== "assistant") {
    view.content.textContent = msg.content || "";
    return;
  }
  const streaming = msg.status === "streaming";
  if (streaming && !msg.content && !(msg.tool_calls && msg.tool_calls.length)) {
    view.content.replaceChildren(h("span.typing", { role: "img", "aria-label": "Generating" }, h("i"), h("i"), h("i")));
    return;
  }
  view.content.querySelector(".caret")?.remove();
  view.content.querySelector(".tool-cards")?.remove();
  renderInto(view.content, msg.content || "");
  if (msg.tool_calls && msg.tool_calls.length) {
    view.content.appendChild(h("div.tool-cards", {}, toolCards(msg)));
  }
  if (!streaming) return;
  // put the caret at the end of the innermost last block, so it follows the text
  let target = view.content;
  for (;;) {
    const last = target.lastElementChild;
    if (!last || !CARET_HOSTS.test(last.tagName)) break;
    target = last.classList.contains("code-block") ? last.querySelector("code") : last;
  }
  target.appendChild(h("span.caret", { "aria-hidden": "true" }));
}

function renderBadge(msg, view) {
  let text = BADGES[msg.status] || "";
  if (msg.status === "complete" && msg.finish_reason === "length") text = "Max tokens reached";
  if (msg.status === "error" && msg.error) text = "Error: " + msg.error;
  view.badge.textContent = text;
  view.badge.hidden = !text;
  view.badge.className = "badge" + (msg.status === "error" ? " badge-error" : "");
}

function renderStats(msg, view) {
  const parts = [];
  const stat = (name, text, title) => h("span.stat", { dataset: { stat: name }, title }, text);
  if (msg.role === "assistant" && msg.status !== "streaming") {
    if (msg.completion_tokens != null) parts.push(stat("tokens", msg.completion_tokens + " tokens", "Generated tokens"));
    if (msg.tokens_per_s != null) parts.push(stat("tokens-per-s", Number(msg.tokens_per_s).toFixed(1) + " tok/s", "Decode speed"));
    if (msg.cached_tokens != null) {
      const of = msg.prompt_tokens != null ? " / " + msg.prompt_tokens : "";
      parts.push(stat("cached", msg.cached_tokens + of + " cached", "Prompt tokens served from the prefix cache / prompt tokens"));
    }
    if (msg.ttft_ms != null) parts.push(stat("ttft", "TTFT " + Math.round(msg.ttft_ms) + " ms", "Time to first token"));
  }
  view.stats.replaceChildren(...parts.flatMap((p, i) => (i ? [h("span.sep", { "aria-hidden": "true" }, "·"), p] : [p])));
}
