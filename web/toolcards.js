// A reply's tool calls as compact cards: the function's name, its arguments pretty-printed and, once a client
// posted it, the call's result (the session's `tool` message answering it, found in the open session).
import { h } from "./dom.js";
import { state } from "./state.js";

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
        : h("div.tool-result.tool-pending", { dataset: { testid: "tool-pending" } },
          msg.status === "streaming" ? "" : "Waiting for the result"));
  });
}
