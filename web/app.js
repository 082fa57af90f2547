// Forge chat UI, the entry module: sessions over REST, chat turns over the WebSocket (/ws).
// Every side effect starts here: the socket, the listeners, and who redraws on which change.
import { ChatSocket } from "./socket.js";
import { on } from "./state.js";
import { $, showConnection, openSidebar, closeSidebar } from "./chrome.js";
import { icon } from "./dom.js";
import { useSocket } from "./commands.js";
import { handleEvent, handleClose, followOtherTabs } from "./events.js";
import { refreshActions, onCodeCopy } from "./messages.js";
import { refreshSessions, newSession, openSession, closeSession, openCurrent, routeId } from "./sessions.js";
import { renderSessionList } from "./sidebar.js";
import { send, stop, showBusy, onKeydown, autosize } from "./composer.js";
import { toggleSettings, syncSettings, saveSettings, showTemperature } from "./settings.js";
import { exportSession, importFile } from "./transfer.js";
import { onSearchInput, onSearchSubmit, onSearchKeydown } from "./search.js";
import { loadModels, syncModel, chooseModel } from "./models.js";

const FOLLOW_EVERY_MS = 2000;

on("sessions", renderSessionList);
on("session", syncSettings);
on("session", syncModel);
on("busy", showBusy);
on("busy", refreshActions);

const ICONS = { "open-sidebar": "menu", "close-sidebar": "close", "close-settings": "close", send: "send", stop: "stop" };
for (const [id, name] of Object.entries(ICONS)) $(id).append(icon(name));
const LEADING_ICONS = { "new-session": "plus", "export-session": "download", "toggle-settings": "settings", "import-session": "upload" };
for (const [id, name] of Object.entries(LEADING_ICONS)) $(id).prepend(icon(name));

$("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("input").addEventListener("keydown", onKeydown);
$("input").addEventListener("input", autosize);
$("stop").addEventListener("click", stop);
$("new-session").addEventListener("click", newSession);
$("toggle-settings").addEventListener("click", () => toggleSettings());
$("close-settings").addEventListener("click", () => toggleSettings(false));
$("settings-form").addEventListener("submit", saveSettings);
$("set-temperature").addEventListener("input", showTemperature);
$("export-session").addEventListener("click", exportSession);
$("model-picker").addEventListener("change", chooseModel);
$("import-session").addEventListener("click", () => $("import-file").click());
$("import-file").addEventListener("change", (e) => {
  const f = e.target.files && e.target.files[0];
  if (f) importFile(f);
  e.target.value = "";
});
$("search-form").addEventListener("submit", onSearchSubmit);
$("search-input").addEventListener("input", onSearchInput);
$("search-input").addEventListener("keydown", onSearchKeydown);
$("open-sidebar").addEventListener("click", openSidebar);
$("close-sidebar").addEventListener("click", closeSidebar);
$("scrim").addEventListener("click", closeSidebar);
$("messages").addEventListener("click", onCodeCopy);
// Escape closes the settings drawer, else the sidebar drawer (inner handlers stop it first:
// the composer stops a reply, an in-place edit or rename is cancelled, a search is cleared)
document.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || e.defaultPrevented) return;
  if (!$("settings").hidden) toggleSettings(false);
  else closeSidebar();
});
window.addEventListener("hashchange", () => {
  const id = routeId();
  if (id) openSession(id);
  else closeSession();
});

useSocket(new ChatSocket(wsUrl(), {
  onOpen: () => {
    openCurrent();
    refreshSessions();
  },
  onClose: handleClose,
  onEvent: handleEvent,
  onState: showConnection,
}));
setInterval(followOtherTabs, FOLLOW_EVERY_MS);

loadModels();
refreshSessions().then(() => {
  const id = routeId();
  if (id) openSession(id);
});

function wsUrl() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
}
