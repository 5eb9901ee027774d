// Voice: the microphone streams to /v1/realtime while you speak. An AudioWorklet taps the samples
// (16 kHz: the AudioContext resamples the device), every 100 ms go up as PCM16 in an
// input_audio_buffer.append, the server's VAD finds the end of each turn, the transcript shows as
// it is recognised, and the answer streams right after the turn ends. Speaking again during an
// answer stops it (the server cancels it: barge-in). With a voice chosen in the settings the answers
// are spoken (output_modalities ["audio"]) and play as they arrive (speaker.js); speaking over one stops
// its playback and truncates it to what was heard, so the model's next prompt holds only that. One
// connection for the whole voice session; the conversation so far is replayed into it when it opens.

import { realtimeProtocols, realtimeURL } from "./api.js";
import { Speaker } from "./speaker.js";
import { setupEvents } from "./typeahead.js";

const RATE_HZ = 16000;
const CHUNK_SAMPLES = RATE_HZ / 10;  // 100 ms per append

/** PCM16 little-endian of float samples in [-1, 1], as base64. */
export function pcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  samples.forEach((x, i) => view.setInt16(2 * i, Math.max(-32768, Math.min(32767, Math.round(x * 32767))), true));
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

export class Voice {
  /** hooks: {context() -> session context, conversation, onStatus(text), onTurn(answerPromise), onEnd(),
   *  voiceOut() -> the voice to speak answers in, or "" for text} */
  constructor(hooks) {
    this.hooks = hooks;
    this.socket = null;
    this.audio = null;  // {context, stream, node}
    this.pending = [];
    this.numPending = 0;
    this.sentSamples = 0;  // audio sent on this connection: the clock of the server's audio_end_ms
    this.user = null;  // the user message being spoken: {message, node}
    this.answer = null;  // {view, resolve, reject}
    this.stoppedAt = null;
    this.speaker = new Speaker();
  }

  get active() {
    return this.socket !== null;
  }

  async start() {
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true } });
    const context = new AudioContext({ sampleRate: RATE_HZ });
    await context.audioWorklet.addModule("web/pcm-worklet.js");
    const node = new AudioWorkletNode(context, "pcm-tap");
    if (this.hooks.voiceOut?.()) this.speaker.open();  // within the button's gesture: it may play
    context.createMediaStreamSource(stream).connect(node);
    this.audio = { context, stream, node };
    this.#open();
    node.port.onmessage = (message) => this.#samples(message.data);
    this.hooks.onStatus("Listening: speak, then pause for the answer.");
  }

  stop() {
    const { audio, socket } = this;
    this.audio = this.socket = null;
    this.speaker.close();
    if (audio) {
      audio.node.port.onmessage = null;
      audio.stream.getTracks().forEach((track) => track.stop());
      audio.context.close();
    }
    if (socket) {
      socket.onmessage = socket.onclose = null;
      socket.close(1000);
    }
    this.answer?.reject(Object.assign(new Error("stopped"), { name: "AbortError" }));
    this.answer = null;
    this.user = null;
    this.hooks.onStatus("");
    this.hooks.onEnd();
  }

  /** Stop the answer in flight (the connection and the microphone stay). */
  cancel() {
    if (this.answer && this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: "response.cancel" }));
    }
  }

  #open() {
    const socket = new WebSocket(realtimeURL(), realtimeProtocols());
    this.socket = socket;
    this.sentSamples = 0;
    const queue = [];
    // The page sends 16 kHz PCM16: it says so (a session that names no format reads OpenAI's 24 kHz).
    queue.push({ type: "session.update", session: { audio: { input: { format: { type: "audio/pcm", rate: RATE_HZ } } } } });
    const voice = this.hooks.voiceOut?.();
    if (voice) queue.push({ type: "session.update", session: { output_modalities: ["audio"], audio: { output: { voice } } } });
    for (const event of setupEvents(this.hooks.context())) queue.push(event);
    socket.onopen = () => queue.forEach((event) => socket.send(JSON.stringify(event)));
    socket.onmessage = (message) => this.#receive(JSON.parse(message.data));
    socket.onclose = () => {
      if (this.socket === socket) this.stop();
    };
  }

  #samples(block) {
    this.pending.push(block);
    this.numPending += block.length;
    if (this.numPending < CHUNK_SAMPLES || this.socket?.readyState !== WebSocket.OPEN) return;
    const chunk = new Float32Array(this.numPending);
    let at = 0;
    for (const part of this.pending) {
      chunk.set(part, at);
      at += part.length;
    }
    this.pending = [];
    this.numPending = 0;
    this.socket.send(JSON.stringify({ type: "input_audio_buffer.append", audio: pcm16Base64(chunk) }));
    this.sentSamples += chunk.length;
  }

  #receive(event) {
    switch (event.type) {
      case "input_audio_buffer.speech_started":
        this.hooks.onStatus("Hearing you…");
        this.#bargeIn();
        break;
      case "input_audio_buffer.speech_stopped": {
        // The event comes once the VAD's silence has passed; the speech ended audio_end_ms into the audio sent,
        // so as much earlier than now as the audio sent since then lasts.
        const sinceMs = this.sentSamples * 1000 / RATE_HZ - event.audio_end_ms;
        this.stoppedAt = performance.now() - Math.max(0, sinceMs);
        break;
      }
      case "conversation.item.input_audio_transcription.delta":
        this.#heard(event.delta);
        break;
      case "conversation.item.input_audio_transcription.completed":
        this.#heardAll(event.transcript);
        break;
      case "response.created":
        this.#answerStarts();
        break;
      case "response.output_text.delta":
      case "response.text.delta":
      case "response.output_audio_transcript.delta":
        this.answer?.view.text(event.delta);
        break;
      case "response.output_audio.delta":
        this.speaker.play(event.item_id, event.delta);
        break;
      case "conversation.item.truncated":  // the server's own estimate at the barge-in, then the page's cut
        window.rillVoiceOut?.truncated.push(event.audio_end_ms);
        break;
      case "response.done":
        this.#answerEnds(event.response);
        break;
      case "error":
        this.hooks.onStatus(`Voice: ${event.error.message}`);
        if (event.error.code === "audio_not_supported") this.stop();
        break;
    }
  }

  /** The user speaks over a spoken answer: its playback stops, and the server learns how much was heard. */
  #bargeIn() {
    const cut = this.speaker.stop();
    if (cut && this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: "conversation.item.truncate", item_id: cut.itemId, content_index: 0,
                                        audio_end_ms: cut.playedMs }));
    }
  }

  #heard(delta) {
    if (!this.user) {
      this.hooks.conversation.addUser("");
      const items = this.hooks.conversation.list.querySelectorAll("li.user");
      this.user = { message: this.hooks.conversation.messages.at(-1), node: items[items.length - 1].querySelector(".content") };
    }
    this.user.message.content += delta;
    this.user.node.textContent = this.user.message.content;
  }

  #heardAll(transcript) {
    if (transcript && !this.user) this.#heard(transcript);
    else if (this.user) {
      this.user.message.content = transcript;
      this.user.node.textContent = transcript;
    }
    this.user = null;
    this.hooks.onStatus("Listening: speak, then pause for the answer.");
  }

  #answerStarts() {
    const view = this.hooks.conversation.startAnswer(this.stoppedAt ?? performance.now(), "voice, realtime");
    view.after = "you stopped speaking";
    const done = new Promise((resolve, reject) => {
      this.answer = { view, resolve, reject };
    });
    this.hooks.onTurn(view, done);
  }

  #answerEnds(response) {
    const answer = this.answer;
    this.answer = null;
    if (!answer) return;
    if (response.status === "failed") {
      answer.reject(new Error(response.status_details?.error?.message ?? "the response failed"));
      return;
    }
    const reason = response.status_details?.reason;
    const status = response.status === "cancelled" && reason === "turn_detected" ? "interrupted"
      : { completed: "stop", cancelled: "stopped", incomplete: "length" }[response.status] ?? response.status;
    answer.resolve({ tokens: response.usage?.output_tokens ?? null, status });
  }
}
