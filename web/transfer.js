// Export the open session as a JSON file; import one exported before.
import { api } from "./api.js";
import { state } from "./state.js";
import { toast } from "./chrome.js";
import { h } from "./dom.js";
import { navigate, upsertSession } from "./sessions.js";

const URL_LIFETIME_MS = 10000;

export async function exportSession() {
  if (!state.current) return;
  try {
    const data = await api.exportSession(state.current.id);
    const blob = new Blob([JSON.stringify(data, null, 2)], { type: "application/json" });
    const slug = (state.current.title || "session").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 40) || "session";
    const a = h("a", { href: URL.createObjectURL(blob), download: "forge-" + slug + ".json" });
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), URL_LIFETIME_MS);
  } catch (err) {
    toast("Export failed: " + err.message, "error");
  }
}

export async function importFile(file) {
  let data;
  try {
    data = JSON.parse(await file.text());
  } catch {
    toast(file.name + " is not a JSON export", "error");
    return;
  }
  try {
    const s = await api.importSession(data);
    upsertSession(s);
    navigate(s.id);
    toast("Imported “" + (s.title || "session") + "”");
  } catch (err) {
    toast("Import failed: " + err.message, "error");
  }
}
