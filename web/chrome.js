// The page around the conversation: element lookup, toasts, connection status, sidebar drawer.
import { h } from "./dom.js";

export const $ = (id) => document.getElementById(id);

/** Show a short notice in the corner; errors are announced as alerts. */
export function toast(text, kind = "info") {
  const t = h("div.toast", { role: kind === "error" ? "alert" : "status", dataset: { testid: "toast", kind } }, text);
  $("toasts").appendChild(t);
  setTimeout(() => t.classList.add("leaving"), 5000);
  setTimeout(() => t.remove(), 5400);
}

/** Reflect the chat socket's state ("connecting" | "open" | "reconnecting") in the sidebar. */
export function showConnection(st, info) {
  const el = $("conn-status");
  el.dataset.state = st;
  el.querySelector(".conn-text").textContent = st === "open" ? "Connected" : st === "connecting" ? "Connecting…" : "Reconnecting…";
  el.title = st === "reconnecting" && info && info.retryInMs ? "Next attempt in " + Math.max(1, Math.round(info.retryInMs / 1000)) + " s" : "";
}

/** The sidebar is a drawer on narrow screens: opening it moves focus in, closing gives it back. */
export function openSidebar() {
  $("layout").classList.add("sidebar-open");
  $("open-sidebar").setAttribute("aria-expanded", "true");
  if (drawerMode()) $("new-session").focus();
}

export function closeSidebar() {
  const layout = $("layout");
  if (!layout.classList.contains("sidebar-open")) return false;
  const hadFocus = $("sidebar").contains(document.activeElement);
  layout.classList.remove("sidebar-open");
  $("open-sidebar").setAttribute("aria-expanded", "false");
  if (hadFocus && drawerMode()) $("open-sidebar").focus();
  return true;
}

function drawerMode() {
  return getComputedStyle($("open-sidebar")).display !== "none";
}
