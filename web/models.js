// The model picker in the header: the models the server serves (/v1/models) and the open session's model.
// Shown only when the server serves more than one; choosing one stores it on the session (its next turns run on it).
import { api } from "./api.js";
import { state } from "./state.js";
import { $, toast } from "./chrome.js";
import { upsertSession } from "./sessions.js";

let models = []; // /v1/models' cards, the default first

/** Load the served models and fill the picker (once at start; a failure leaves it hidden). */
export async function loadModels() {
  try {
    models = await api.listModels();
  } catch {
    models = [];
  }
  const picker = $("model-picker");
  picker.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  $("model-pick").hidden = models.length < 2;
  syncModel();
}

/** Show the open session's model (none stored: the default, the first listed). */
export function syncModel() {
  const picker = $("model-picker");
  const s = state.current;
  picker.disabled = !s || models.length < 2;
  if (!s || !models.length) return;
  const known = models.some((m) => m.id === s.model);
  picker.value = known ? s.model : models[0].id;
}

/** The user chose a model: store it on the open session. */
export async function chooseModel() {
  const s = state.current;
  if (!s) return;
  const picker = $("model-picker");
  try {
    upsertSession(await api.updateSession(s.id, { model: picker.value }));
  } catch (error) {
    toast(error.message, "error");
    syncModel();
  }
}
