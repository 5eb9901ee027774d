// Camera: live video into a vision model over /v1/realtime. getUserMedia's video plays in a small
// preview; every 1/fps seconds the current picture is drawn to a canvas (longest side MAX_SIDE_PX),
// encoded as JPEG and sent as an input_video_frame.append with its timestamp_ms. The server encodes
// and prefills each frame as it arrives (keeping the newest when the encoder falls behind: it says so
// in input_video_frame.dropped), so a question typed meanwhile (conversation.item.create +
// response.create on the same socket) is answered about everything seen so far, about one engine
// step after it. One connection for the whole camera session; the conversation so far is replayed
// into it when it opens. Turning the camera off stops the tracks and closes the socket: the server
// frees the feed and its KV.

import { realtimeProtocols, realtimeURL, settleAnswer } from "./api.js";
import { setupEvents } from "./typeahead.js";

export const MAX_SIDE_PX = 336;  // Qwen2-VL's patches are 28 px merged: 336 = 12 of them
const JPEG_QUALITY = 0.8;
// The browser never queues frames without bound: while the socket still holds this much unsent, the
// next frame is skipped (a few frames of 336 px JPEG; the server's own pacing drops beyond that).
export const MAX_BUFFERED_BYTES = 128 * 1024;

/** Whether a frame may go now: the socket is open and its send buffer is not full. */
export function hasRoom(socket) {
  return socket.readyState === WebSocket.OPEN && socket.bufferedAmount <= MAX_BUFFERED_BYTES;
}

/** Send one frame; false (skipped, nothing queued) when the socket has no room for it. */
export function offerFrame(socket, image, timestampMs, eventId) {
  if (!hasRoom(socket)) return false;
  const event = { type: "input_video_frame.append", event_id: eventId, image, timestamp_ms: timestampMs };
  socket.send(JSON.stringify(event));
  return true;
}

/** [width, height] with the longest side at most `maxSide` (never scaled up). */
export function frameSize(width, height, maxSide = MAX_SIDE_PX) {
  const scale = Math.min(1, maxSide / Math.max(width, height));
  return [Math.max(1, Math.round(width * scale)), Math.max(1, Math.round(height * scale))];
}

/** What getUserMedia's refusal means for the person at the page. */
export function captureError(error) {
  switch (error.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "permission to use the camera was denied (allow it in the browser's site settings, then try again)";
    case "NotFoundError":
    case "OverconstrainedError":
      return "no camera was found";
    case "NotReadableError":
      return "the camera is in use by another program";
    default:
      return error.message;
  }
}

export class Camera {
  /** hooks: {context() -> session context, onStatus(text, isError), onCounts(counts), onEnd()} */
  constructor(hooks) {
    this.hooks = hooks;
    this.socket = null;
    this.model = null;  // the model the session was opened for
    this.stream = null;
    this.preview = null;
    this.canvas = document.createElement("canvas");
    this.timer = null;
    this.queue = [];  // events written before the socket opened
    this.answer = null;  // {view, resolve, reject, eventIds}
    this.numAsked = 0;
    this.counts = { numSent: 0, numDropped: 0, numSkipped: 0 };
    this.startedAt = 0;
  }

  get active() {
    return this.socket !== null;
  }

  /** Ask for the camera, show it in `preview` (a <video>), open the socket, send `fps` frames a second. */
  async start(preview, fps) {
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 640 }, height: { ideal: 480 } } });
    } catch (error) {
      throw new Error(captureError(error));
    }
    this.stream = stream;
    this.preview = preview;
    preview.srcObject = stream;
    this.counts = { numSent: 0, numDropped: 0, numSkipped: 0 };
    this.hooks.onCounts(this.counts);
    this.#open();
    await preview.play();
    if (!this.active) return;  // turned off (or the socket closed) while the preview started
    this.startedAt = performance.now();
    this.setRate(fps);
    this.hooks.onStatus("Camera on: the model sees what it shows; type a question about it.", false);
  }

  setRate(fps) {
    clearInterval(this.timer);
    if (this.active) this.timer = setInterval(() => this.#frame(), 1000 / fps);
  }

  /** Answer `text` about what the camera showed, into `view`, with at most `maxTokens` (the rest of the
   * session's settings are those it opened with: another temperature or system prompt would make the
   * server prefill the frames again); resolves to {tokens, status} at response.done. */
  ask(text, view, { maxTokens }) {
    this.numAsked += 1;
    const eventIds = [`ask_${this.numAsked}`, `ask_${this.numAsked}_response`];
    return new Promise((resolve, reject) => {
      this.answer = { view, resolve, reject, eventIds };
      this.#send({ type: "conversation.item.create", event_id: eventIds[0],
                   item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
      this.#send({ type: "response.create", event_id: eventIds[1],
                   response: { max_output_tokens: maxTokens } });
    });
  }

  /** Stop the answer in flight (the camera and the connection stay). */
  cancel() {
    if (this.answer) this.#send({ type: "response.cancel" });
  }

  /** Turn the camera off: the tracks stop, the socket closes (the server frees the feed); `message` stays shown. */
  stop(message = "", isError = false) {
    const { socket, stream } = this;
    this.socket = this.stream = null;
    clearInterval(this.timer);
    stream?.getTracks().forEach((track) => track.stop());
    if (this.preview) this.preview.srcObject = null;
    if (socket) {
      socket.onopen = socket.onmessage = socket.onclose = null;
      socket.close(1000);
    }
    this.queue = [];
    this.answer?.reject(Object.assign(new Error("the camera was turned off"), { name: "AbortError" }));
    this.answer = null;
    this.hooks.onStatus(message, isError);
    this.hooks.onEnd();
  }

  #open() {
    const socket = new WebSocket(realtimeURL(), realtimeProtocols());
    const context = this.hooks.context();
    this.socket = socket;
    this.model = context.model;
    this.queue = setupEvents(context).map((event) => JSON.stringify(event));
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.queue.forEach((data) => socket.send(data));
      this.queue = [];
    };
    socket.onmessage = (message) => this.#receive(JSON.parse(message.data));
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      const why = !opened ? "the server could not be reached" : event.code === 1006 ? "the server went away"
        : `code ${event.code}${event.reason ? `: ${event.reason}` : ""}`;
      this.stop(`Camera off: the connection to the server closed (${why}).`, true);
    };
  }

  #send(event) {
    const data = JSON.stringify(event);
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(data);
    else this.queue.push(data);
  }

  #frame() {
    const video = this.preview;
    if (this.socket?.readyState !== WebSocket.OPEN) return;  // still connecting: nothing to count yet
    if (video.readyState < HTMLMediaElement.HAVE_CURRENT_DATA || !video.videoWidth) return;
    if (!hasRoom(this.socket)) {  // skipped before it is drawn and encoded
      this.counts.numSkipped += 1;
      this.hooks.onCounts(this.counts);
      return;
    }
    const [width, height] = frameSize(video.videoWidth, video.videoHeight);
    this.canvas.width = width;
    this.canvas.height = height;
    this.canvas.getContext("2d").drawImage(video, 0, 0, width, height);
    const image = this.canvas.toDataURL("image/jpeg", JPEG_QUALITY).split(",", 2)[1];
    const at = Math.round(performance.now() - this.startedAt);
    if (offerFrame(this.socket, image, at, `frame_${this.counts.numSent + 1}`)) this.counts.numSent += 1;
    else this.counts.numSkipped += 1;
    this.hooks.onCounts(this.counts);
  }

  #receive(event) {
    const answer = this.answer;
    switch (event.type) {
      case "input_video_frame.dropped":
        this.counts.numDropped = event.num_frames_dropped;
        this.hooks.onCounts(this.counts);
        break;
      case "response.output_text.delta":
      case "response.text.delta":
        answer?.view.text(event.delta);
        break;
      case "response.done":
        this.#answerEnds(event.response);
        break;
      case "error":
        this.#error(event.error);
        break;
    }
  }

  #error(error) {
    if (error.code === "unsupported_modality") {
      this.stop(`Camera off: this model does not read video (${error.message}).`, true);
    } else if (this.answer?.eventIds.includes(error.event_id)) {
      const answer = this.answer;
      this.answer = null;
      answer.reject(new Error(error.message));
    } else {
      this.hooks.onStatus(`Camera: ${error.message}`, true);  // a bad frame: the stream goes on
    }
  }

  #answerEnds(response) {
    const answer = this.answer;
    this.answer = null;
    if (!answer) return;
    settleAnswer(answer, response);
  }
}
