// The page: wires the message box, the settings, the conversation and the live panel together.

import { Unauthorized, getJSON, setApiKey } from "./api.js";
import { Camera } from "./camera.js";
import { chatBody, streamChat } from "./chat.js";
import { Conversation } from "./conversation.js";
import { startMetrics } from "./metrics.js";
import { FallBack, TypeAhead } from "./typeahead.js";
import { Voice } from "./voice.js";

const $ = (id) => document.getElementById(id);
const conversation = new Conversation($("log"));
const typeAhead = new TypeAhead(showTypeAheadStatus);
let version = 0;  // bumped when the conversation changes: a type-ahead socket replays the old one
let busy = null;  // {stop} while an answer streams
const modelCards = new Map();  // id -> its /v1/models card (input_modalities says whether it reads video)
const voice = new Voice({
  context: () => typeAheadContext(sessionSettings()),
  conversation,
  onStatus: (text) => { $("voice-status").textContent = text; },
  onTurn: voiceTurn,
  voiceOut: () => $("voice-out").value,
  onEnd: () => {
    $("mic").setAttribute("aria-pressed", "false");
    $("mic").textContent = "Microphone";
  },
});
const camera = new Camera({
  context: () => typeAheadContext(sessionSettings()),
  onStatus: (text, isError) => {
    $("camera-status").textContent = text;
    $("camera-status").classList.toggle("error", isError);
  },
  onCounts: ({ numSent, numDropped, numSkipped }) => {
    const counts = $("camera-counts");
    counts.textContent = `${numSent} frames sent · ${numDropped} dropped by the server · ${numSkipped} skipped here`;
    Object.assign(counts.dataset, { sent: numSent, dropped: numDropped, skipped: numSkipped });
  },
  onEnd: () => {
    $("camera").setAttribute("aria-pressed", "false");
    $("camera-panel").hidden = true;
    syncTypeAhead();
  },
});

/** The settings a type-ahead connection depends on (the extra fields only go with SSE). */
function sessionSettings() {
  return {
    model: $("model").value,
    temperature: Number($("temperature").value) || 0,
    maxTokens: Math.max(1, Math.round(Number($("max-tokens").value) || 256)),
    system: $("system").value.trim(),
    tools: $("tools").checked,
  };
}

function settings() {
  return { ...sessionSettings(), extra: extraFields() };
}

/** The "extra request fields" box: a JSON object, or an error shown beside it. */
function extraFields() {
  const text = $("extra").value.trim();
  $("extra-error").textContent = "";
  if (!text) return {};
  try {
    const value = JSON.parse(text);
    if (value && typeof value === "object" && !Array.isArray(value)) return value;
  } catch { /* reported below */ }
  $("extra-error").textContent = "Extra request fields must be a JSON object.";
  throw new Error("invalid extra fields");
}

/** What a type-ahead connection is opened for; `key` changes when any of it does. */
function typeAheadContext(s) {
  const { model, temperature, maxTokens, system, tools } = s;
  const key = JSON.stringify({ model, temperature, maxTokens, system, tools, version });
  return { key, model, temperature, maxTokens, system, tools, history: conversation.messages };
}

function syncTypeAhead() {
  if (busy || camera.active || !$("typeahead").checked) return;  // with the camera on, questions go on its socket
  typeAhead.update($("prompt").value, typeAheadContext(sessionSettings()));
}

function showTypeAheadStatus(text, numSent) {
  const status = $("typeahead-status");
  status.textContent = text;
  status.dataset.sent = numSent;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value;
  if (busy || !text.trim()) return;
  let s;
  try {
    s = settings();
  } catch {
    $("extra").focus();
    return;
  }
  const startedAt = performance.now();
  if (document.activeElement === $("send")) $("prompt").focus();  // Send is disabled while answering
  const viaRealtime = $("typeahead").checked;
  const viaCamera = camera.active;
  const context = typeAheadContext(s);  // the conversation before this message, as typed against
  conversation.addUser(text);
  version += 1;
  $("prompt").value = "";
  const via = viaCamera ? "realtime, camera" : viaRealtime ? "realtime, type-ahead" : "SSE";
  const view = conversation.startAnswer(startedAt, via);
  setBusy({ stop: () => {} });
  try {
    view.finish(viaCamera ? await answerCamera(text, s, view)
      : viaRealtime ? await answerRealtime(text, context, s, view) : await answerSSE(s, view));
    announce("Answer complete.");
  } catch (error) {
    if (error.name === "AbortError") {
      view.finish({ tokens: null, status: "stopped" });
      announce("Answer stopped.");
    } else {
      view.fail(error.message);
      announce(`Error: ${error.message}`);
      if (error instanceof Unauthorized) askKey().then(loadModels);
    }
  } finally {
    const stopHadFocus = document.activeElement === $("stop");
    setBusy(null);
    if (stopHadFocus) $("prompt").focus();  // Stop is disabled again
    $("log").lastElementChild?.scrollIntoView({ block: "end" });
    syncTypeAhead();  // what was typed while the answer streamed
  }
}

async function answerRealtime(text, context, s, view) {
  try {
    const answer = typeAhead.ask(text, context, view);
    busy.stop = () => typeAhead.cancel();
    return await answer;
  } catch (error) {
    if (!(error instanceof FallBack)) throw error;
    view.via = "SSE (the realtime connection failed)";
    return answerSSE(s, view);
  }
}

/** A question about what the camera shows, on the camera's socket: it sees the frames sent so far. */
function answerCamera(text, s, view) {
  busy.stop = () => camera.cancel();
  return camera.ask(text, view, s);
}

function answerSSE(s, view) {
  const controller = new AbortController();
  busy.stop = () => controller.abort();
  const system = s.system ? [{ role: "system", content: s.system }] : [];
  return streamChat(chatBody(s, [...system, ...conversation.messages]), view, controller.signal);
}

/** The microphone button: a voice session over /v1/realtime, until pressed again. */
async function toggleMic() {
  if (voice.active) {
    voice.stop();
    return;
  }
  if (busy) return;
  typeAhead.close();
  if (camera.active) camera.stop();  // one live session at a time
  $("mic").setAttribute("aria-pressed", "true");
  $("mic").textContent = "Stop listening";
  try {
    await voice.start();
  } catch (error) {
    voice.stop();
    $("voice-status").textContent = `Microphone: ${error.message}`;
  }
}

/** The camera button: live video over /v1/realtime for a model that reads video, until pressed again. */
async function toggleCamera() {
  if (camera.active) {
    camera.stop("Camera off.");
    return;
  }
  if (busy || $("camera").dataset.starting) return;
  typeAhead.close();
  if (voice.active) voice.stop();  // one live session at a time
  $("camera").setAttribute("aria-pressed", "true");
  $("camera").dataset.starting = "1";
  $("camera-panel").hidden = false;
  try {
    await camera.start($("camera-preview"), Number($("camera-fps").value));
  } catch (error) {
    camera.stop(`Camera: ${error.message}`, true);
  } finally {
    delete $("camera").dataset.starting;
  }
}

/** Show the camera button for a model whose card says it reads video; another model turns the camera off. */
function showCamera() {
  const model = $("model").value;
  const button = $("camera");
  button.hidden = !(modelCards.get(model)?.input_modalities ?? []).includes("video");
  if (camera.active && camera.model !== model) {
    camera.stop(button.hidden ? "Camera off: the model picked does not read video."
      : "Camera off: another model was picked; turn it on again to show it to that one.", button.hidden);
  }
  if (!button.hidden && !navigator.mediaDevices?.getUserMedia) {
    button.disabled = true;
    $("camera-status").textContent = "This browser cannot capture video here (it needs https or localhost).";
  }
}

/** A spoken turn's answer streams into `view`; Stop cancels it, speaking again interrupts it. */
async function voiceTurn(view, done) {
  setBusy({ stop: () => voice.cancel() });
  try {
    view.finish(await done);
    version += 1;
    announce("Answer complete.");
  } catch (error) {
    if (error.name === "AbortError") view.finish({ tokens: null, status: "stopped" });
    else view.fail(error.message);
  } finally {
    setBusy(null);
    $("log").lastElementChild?.scrollIntoView({ block: "end" });
  }
}

function setBusy(value) {
  busy = value;
  $("send").disabled = value !== null;
  $("stop").disabled = value === null;
}

function stop() {
  busy?.stop();
}

function announce(text) {
  $("announce").textContent = text;
}

function newChat() {
  stop();
  if (voice.active) voice.stop();
  if (camera.active) camera.stop("Camera off: a new chat.");
  conversation.clear();
  version += 1;
  typeAhead.close();
  syncTypeAhead();
  $("prompt").focus();
}

function onPromptKeyDown(event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
}

function onKeyDown(event) {
  if (event.key === "Escape" && busy) stop();
}

/** Ask for the API key (kept in sessionStorage); resolves once one is given. */
function askKey(message = "") {
  const dialog = $("key-dialog");
  $("key-error").textContent = message;
  return new Promise((resolve) => {
    $("key-form").onsubmit = () => {
      setApiKey($("key").value);
      resolve();
    };
    if (!dialog.open) dialog.showModal();
  });
}

async function loadModels(refused = false) {
  try {
    const { data } = await getJSON("v1/models");
    const select = $("model");
    const chat = data.filter((card) => card.task !== "transcription" && card.task !== "speech");  // the speech models hear or speak, they do not chat
    select.replaceChildren(...chat.map((card) => new Option(card.id, card.id)));
    modelCards.clear();
    chat.forEach((card) => modelCards.set(card.id, card));
    showCamera();
  } catch (error) {
    if (!(error instanceof Unauthorized)) {
      showTypeAheadStatus(`Could not list the models: ${error.message}`, 0);
      return;
    }
    await askKey(refused ? "The server refused that key." : "");
    await loadModels(true);
  }
}

function main() {
  if (matchMedia("(max-width: 48rem)").matches) $("settings-panel").open = false;  // a phone: the chat first
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", onPromptKeyDown);
  document.addEventListener("keydown", onKeyDown);
  $("prompt").addEventListener("input", syncTypeAhead);
  $("settings").addEventListener("input", syncTypeAhead);
  $("settings").addEventListener("submit", (event) => event.preventDefault());
  $("typeahead").addEventListener("change", () => $("typeahead").checked ? syncTypeAhead() : typeAhead.close());
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("mic").addEventListener("click", toggleMic);
  $("camera").addEventListener("click", toggleCamera);
  $("camera-fps").addEventListener("change", () => camera.setRate(Number($("camera-fps").value)));
  $("model").addEventListener("change", showCamera);
  if (!navigator.mediaDevices?.getUserMedia || !window.AudioWorkletNode) {
    $("mic").disabled = true;
    $("voice-status").textContent = "This browser cannot capture audio here (it needs https or localhost).";
  }
  startMetrics({ running: $("m-running"), waiting: $("m-waiting"), kv: $("m-kv"), tps: $("m-tps"),
                 realtime: $("m-realtime") }, $("metrics-status"));
  loadModels();
}

main();
