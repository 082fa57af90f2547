// Reply branches: the ‹ 2/3 › switch of a message with alternatives (regenerated replies, edited
// questions), and going to a message that may sit on another branch (a search hit).
import { state, currentId } from "./state.js";
import { $, toast } from "./chrome.js";
import { h } from "./dom.js";
import { send } from "./commands.js";

const FOUND_MS = 2000; // how long a message gone to stays highlighted

let going = null; // {sessionId, messageId, selected}: the message to show once its session's branch is on the page

/** The ‹ i/n › switch of `msg`, or null when it has no alternatives. Unavailable steps stay focusable. */
export function branchSwitch(msg, busy) {
  const ids = msg.siblings || [];
  if (ids.length < 2) return null;
  const i = ids.indexOf(msg.id);
  const step = (dir, label, testid, text) => {
    const target = ids[i + dir];
    const disabled = busy || target === undefined;
    return h("button.branch-step", { type: "button", "aria-label": label, title: label,
      "aria-disabled": disabled ? "true" : null, dataset: { testid },
      onclick: () => { if (!disabled) choose(msg, target, testid); } }, text);
  };
  return h("div.branches", { role: "group", "aria-label": "Version " + (i + 1) + " of " + ids.length,
    dataset: { testid: "branches" } },
    step(-1, "Previous version", "branch-prev", "‹"),
    h("span.branch-count", { dataset: { testid: "branch-count" } }, i + 1 + "/" + ids.length),
    step(1, "Next version", "branch-next", "›"));
}

function choose(msg, target, testid) {
  const sid = currentId();
  send({ type: "branch.select", session_id: sid, message_id: target },
    { type: "select", sessionId: sid, position: msg.position, testid });
}

/** Show message `messageId` of session `sessionId`, switching to its branch when it is not on the page. */
export function goTo(sessionId, messageId, open) {
  going = { sessionId, messageId, selected: false };
  if (currentId() === sessionId && state.messages.length) afterHistory();
  else open(sessionId);
}

/** The open session's branch was (re)drawn; `cmd` is the command it answered, if any. */
export function afterHistory(cmd) {
  if (cmd && cmd.type === "select" && cmd.testid) {
    // the switch of the message at the same place keeps the focus, so arrows can be pressed again
    const at = `[data-testid="message"][data-position="${cmd.position}"] [data-testid="${cmd.testid}"]`;
    $("messages").querySelector(at)?.focus();
  }
  if (!going) return;
  if (going.sessionId !== currentId()) { going = null; return; }
  const el = $("messages").querySelector(`[data-testid="message"][data-id="${CSS.escape(going.messageId)}"]`);
  if (el) {
    going = null;
    el.tabIndex = -1;
    el.classList.add("found");
    el.scrollIntoView({ block: "center" });
    el.focus();
    setTimeout(() => el.classList.remove("found"), FOUND_MS);
  } else if (going.selected) {
    going = null;
    toast("That message is no longer in the conversation", "error");
  } else {
    going.selected = true;
    send({ type: "branch.select", session_id: going.sessionId, message_id: going.messageId },
      { type: "select", sessionId: going.sessionId });
  }
}
