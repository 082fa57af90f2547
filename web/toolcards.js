// A reply's tool calls as compact cards: the function's name, its arguments pretty-printed and, once a client
// posted it or the server ran it (MCP), the call's result (the session's `tool` message answering it, found in the
// open session). An MCP call awaiting approval asks here: allow once, always allow (the tool, in this session), deny.
import { h } from "./dom.js";
import { state } from "./state.js";
import { send } from "./commands.js";

const DECISIONS = [["once", "Allow once"], ["always", "Always allow"], ["deny", "Deny"]];

/** Pretty-printed JSON when `text` parses (arguments still streaming may not), else the text as it is. */
function pretty(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text || "";
  }
}

/** The stored result of call `id` in the open session, or undefined. */
export function resultOf(id) {
  return state.messages.find((m) => m.role === "tool" && m.tool_call_id === id);
}

/** The reply whose calls include `id`, or undefined. */
export function callerOf(id) {
  return state.messages.find((m) => m.role === "assistant" && (m.tool_calls || []).some((c) => c.id === id));
}

/** One card per call of `msg` (an assistant message with `tool_calls`). */
export function toolCards(msg) {
  return (msg.tool_calls || []).map((call) => {
    const fn = call.function || {};
    const result = resultOf(call.id);
    return h("section.tool-card", { dataset: { testid: "tool-call", callId: call.id },
      "aria-label": "Tool call " + (fn.name || "") },
      h("div.tool-card-head", {}, h("span.tool-kind", {}, "Tool call"),
        h("code.tool-name", { dataset: { testid: "tool-name" } }, fn.name || "")),
      h("pre.tool-json", { dataset: { testid: "tool-arguments" }, "aria-label": "Arguments" }, pretty(fn.arguments)),
      result
        ? h("div.tool-result", { dataset: { testid: "tool-result" } }, h("span.tool-kind", {}, "Result"),
          h("pre.tool-json", { "aria-label": "Result" }, pretty(result.content)))
        : pending(msg, call));
  });
}

/** What a call without a result shows: the approval question, that it runs, or that it waits for its result. */
function pending(msg, call) {
  const phase = state.calls.get(call.id)?.phase;
  if (phase === "asking") {
    return h("div.tool-result.tool-approval", { role: "group", "aria-label": "Run this tool?",
      dataset: { testid: "tool-approval" } },
      h("span.tool-ask", {}, "Run this tool?"),
      DECISIONS.map(([decision, label]) => h("button.btn.btn-small" + (decision === "once" ? ".btn-primary" : ".btn-ghost"), {
        type: "button", dataset: { testid: "tool-" + decision },
        onclick: () => decide(state.calls.get(call.id)?.sessionId, call.id, decision),
      }, label)));
  }
  const text = phase === "running" ? "Running…" : phase === "answered" ? "Starting…" : phase === "denied" ? "Denied"
    : msg.status === "streaming" ? "" : "Waiting for the result";
  return h("div.tool-result.tool-pending", { dataset: { testid: phase === "running" ? "tool-running" : "tool-pending" } },
    text);
}

/** Answer the server's approval question for call `id`; the card shows the call starting (or its error result). */
function decide(sessionId, id, decision) {
  if (!send({ type: "tool.approve", session_id: sessionId, tool_call_id: id, decision },
    { type: "approve", sessionId, callId: id })) return;
  state.calls.set(id, { sessionId, phase: decision === "deny" ? "denied" : "answered" });
  const card = document.querySelector(`[data-testid="tool-call"][data-call-id="${CSS.escape(id)}"] .tool-approval`);
  card?.replaceWith(h("div.tool-result.tool-pending", { dataset: { testid: "tool-pending" } },
    decision === "deny" ? "Denied" : "Starting…"));
}
