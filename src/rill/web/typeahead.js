// Type-ahead: while the user types, the text streams to the server over /v1/realtime
// (input_text_buffer.append) and the engine prefills it as it arrives; Enter sends
// response.create, and the answer starts about one engine step later.
//
// One WebSocket per message: it opens with the first character, sets the session (model,
// temperature, max tokens, system prompt, tools), replays the conversation so far
// (conversation.item.create; the prefix cache makes that cheap) and appends the text.
// Edits: rill's streamed text can only grow. While the box's text grows at its end, only the new
// characters go. Any other edit (backspace, a change in the middle, a paste over a selection) or
// a change of settings closes the connection, so the server aborts that session and frees its
// KV, and once typing pauses for EDIT_PAUSE_MS a new connection sends the whole text again.

import { realtimeProtocols, realtimeURL, settleAnswer } from "./api.js";
import { TOOLS } from "./chat.js";

const EDIT_PAUSE_MS = 300;
const RETRY_AFTER_FAILURE_MS = 5000;  // a refused handshake: no new try on every keystroke

/** The socket failed before a response started: the caller answers over SSE instead. */
export class FallBack extends Error {}

export class TypeAhead {
  /** onStatus(text, numSentChars) reports what was sent ahead. */
  constructor(onStatus) {
    this.onStatus = onStatus;
    this.socket = null;
    this.key = null;  // the context the socket was opened for
    this.sent = "";  // the text appended on this socket
    this.queue = [];  // events written before the socket opened
    this.timer = null;
    this.failedAt = -Infinity;
    this.answer = null;  // {view, resolve, reject, started} while a response streams
  }

  /** The box's text after an edit; context: {key, model, temperature, maxTokens, system, tools, history}. */
  update(text, context) {
    clearTimeout(this.timer);
    if (this.socket && this.key === context.key && text.startsWith(this.sent)) {
      this.#append(text.slice(this.sent.length));
      return;
    }
    const edited = this.socket !== null;
    this.close();
    if (!text || performance.now() - this.failedAt < RETRY_AFTER_FAILURE_MS) return;
    if (!edited) {
      this.#open(text, context);
      return;
    }
    this.#status("Edited: the text goes again when you pause.");
    this.timer = setTimeout(() => this.#open(text, context), EDIT_PAUSE_MS);
  }

  /** Enter: answer `text` into `view`; resolves to {tokens, status} at response.done. */
  ask(text, context, view) {
    clearTimeout(this.timer);
    const inSync = this.socket && this.key === context.key && this.sent === text;
    if (!inSync) {
      this.close();
      this.#open(text, context);
    }
    return new Promise((resolve, reject) => {
      this.answer = { view, resolve, reject, started: false };
      this.#send({ type: "response.create" });
    });
  }

  cancel() {
    if (this.answer) this.#send({ type: "response.cancel" });
  }

  close() {
    clearTimeout(this.timer);
    const socket = this.socket;
    this.socket = null;
    this.sent = "";
    this.queue = [];
    if (socket) {
      socket.onopen = socket.onmessage = socket.onclose = null;
      socket.close(1000);
    }
    this.#status("");
  }

  #open(text, context) {
    const socket = new WebSocket(realtimeURL(), realtimeProtocols());
    this.socket = socket;
    this.key = context.key;
    this.opened = false;
    socket.onopen = () => {
      this.opened = true;
      for (const data of this.queue) socket.send(data);
      this.queue = [];
    };
    socket.onmessage = (message) => this.#receive(JSON.parse(message.data));
    socket.onclose = () => this.#closed(socket);
    for (const event of setupEvents(context)) this.#send(event);
    this.#append(text);
  }

  #send(event) {
    const data = JSON.stringify(event);
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(data);
    else this.queue.push(data);
  }

  #append(delta) {
    if (!delta) return;
    this.#send({ type: "input_text_buffer.append", delta });
    this.sent += delta;
    this.#status(`Type-ahead: ${this.sent.length} characters sent; Enter starts the answer.`);
  }

  #receive(event) {
    const answer = this.answer;
    switch (event.type) {
      case "error":
        this.#failed(new Error(event.error.message));
        break;
      case "response.created":
        if (answer) answer.started = true;
        break;
      case "response.output_text.delta":
      case "response.text.delta":
        answer?.view.text(event.delta);
        break;
      case "response.output_item.added":
        if (event.item.type === "function_call") {
          answer?.view.toolCall(event.output_index, { id: event.item.call_id, name: event.item.name, args: "" });
        }
        break;
      case "response.function_call_arguments.delta":
        answer?.view.toolCall(event.output_index, { args: event.delta });
        break;
      case "response.done":
        this.#done(event.response);
        break;
    }
  }

  #done(response) {
    const answer = this.answer;
    this.answer = null;
    this.close();  // one connection per message
    if (!answer) return;
    settleAnswer(answer, response);
  }

  /** An error event: the typed text may be gone on the server (e.g. too long), so start afresh. */
  #failed(error) {
    const answer = this.answer;
    this.answer = null;
    this.close();
    this.failedAt = performance.now();
    if (answer) answer.reject(error);
    else this.#status(`Type-ahead stopped: ${error.message}`);
  }

  #closed(socket) {
    if (socket !== this.socket) return;
    this.socket = null;
    this.sent = "";
    if (!this.opened) this.failedAt = performance.now();
    const answer = this.answer;
    this.answer = null;
    if (answer) answer.reject(answer.started ? new Error("the realtime connection closed") : new FallBack("closed"));
    this.#status("");
  }

  #status(text) {
    this.onStatus(text, this.sent.length);
  }
}

/** session.update and the conversation so far, as realtime client events. */
export function setupEvents({ model, temperature, maxTokens, system, tools, history }) {
  const session = { model, temperature, max_output_tokens: maxTokens, instructions: system };
  if (tools) {
    session.tools = TOOLS.map((tool) => ({ type: "function", ...tool.function }));
    session.tool_choice = "auto";
  }
  return [{ type: "session.update", session }, ...history.flatMap(historyItems)];
}

function historyItems(message) {
  const create = (item) => ({ type: "conversation.item.create", item });
  if (message.role === "user") {
    return [create({ type: "message", role: "user", content: [{ type: "input_text", text: message.content }] })];
  }
  const items = [];
  if (message.content) {
    items.push(create({ type: "message", role: "assistant", content: [{ type: "output_text", text: message.content }] }));
  }
  for (const call of message.tool_calls ?? []) {
    items.push(create({ type: "function_call", call_id: call.id, name: call.function.name,
                        arguments: call.function.arguments }));
  }
  return items;
}
