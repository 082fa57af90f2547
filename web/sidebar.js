// The session list in the sidebar: open, rename in place, delete (click twice).
import { api, ApiError } from "./api.js";
import { state, currentId, isBusy } from "./state.js";
import { $, toast } from "./chrome.js";
import { h, icon, keepFocus } from "./dom.js";
import { navigate, upsertSession, dropSession } from "./sessions.js";

const CONFIRM_MS = 4000;

/** Redraw the list from state.sessions (left alone while a title is being edited). */
export function renderSessionList() {
  const list = $("session-list");
  if (list.querySelector("input.rename")) return;
  const items = state.sessions.map((s) => sessionItem(s));
  if (!items.length) items.push(h("p.session-empty", {}, "No conversations yet"));
  keepFocus(list, () => list.replaceChildren(...items));
}

function sessionItem(s) {
  const active = currentId() === s.id;
  const busy = isBusy(s.id);
  const rename = h("button.icon-btn", { type: "button", title: "Rename", "aria-label": "Rename", dataset: { testid: "session-rename" },
    onclick: (e) => { e.stopPropagation(); startRename(item, s); } }, icon("edit"));
  const del = h("button.icon-btn.danger", { type: "button", title: "Delete", "aria-label": "Delete", dataset: { testid: "session-delete" },
    onclick: (e) => { e.stopPropagation(); confirmDelete(del, s); } }, icon("trash"));
  const item = h("div.session-item", { dataset: { testid: "session-item", id: s.id, busy: busy ? "1" : "0" }, "aria-current": active ? "page" : null },
    h("button.session-open", { type: "button", dataset: { testid: "session-open" }, onclick: () => navigate(s.id) },
      busy ? h("span.busy-dot", { title: "Generating" }) : null,
      h("span.session-name", { dataset: { testid: "session-name" } }, s.title || "Untitled")),
    h("div.session-actions", {}, rename, del));
  return item;
}

function startRename(item, s) {
  const input = h("input.rename", { value: s.title || "", maxLength: 200, dataset: { testid: "session-rename-input" }, "aria-label": "Session title" });
  let done = false;
  const finish = async (save, refocus) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    input.remove();
    if (save && title && title !== s.title) {
      try {
        upsertSession(await api.updateSession(s.id, { title }));
      } catch (err) {
        toast("Rename failed: " + err.message, "error");
      }
    }
    renderSessionList();
    if (refocus) $("session-list").querySelector(`[data-id="${CSS.escape(s.id)}"] [data-testid="session-rename"]`)?.focus();
  };
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter") { e.preventDefault(); finish(true, true); }
    if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false, true); }
  });
  input.addEventListener("blur", () => finish(true, false));
  item.replaceChildren(input);
  input.focus();
  input.select();
}

function confirmDelete(btn, s) {
  if (btn.dataset.confirm !== "1") {
    btn.dataset.confirm = "1";
    btn.title = "Click again to delete";
    btn.setAttribute("aria-label", "Confirm delete");
    btn.closest(".session-item").classList.add("confirming");
    setTimeout(() => {
      btn.dataset.confirm = "0";
      btn.title = "Delete";
      btn.setAttribute("aria-label", "Delete");
      btn.closest(".session-item")?.classList.remove("confirming");
    }, CONFIRM_MS);
    return;
  }
  deleteSession(s);
}

async function deleteSession(s) {
  try {
    await api.deleteSession(s.id);
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 404)) {
      toast("Delete failed: " + err.message, "error");
      return;
    }
  }
  dropSession(s.id);
  $("new-session").focus();
}
