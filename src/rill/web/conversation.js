// The conversation: what the page shows (a list of messages) and what it sends back to the
// server on the next turn (OpenAI chat messages). Text goes in as text nodes, never as HTML.

export class Conversation {
  constructor(list) {
    this.list = list;
    this.messages = [];  // user and assistant chat messages, in order
  }

  addUser(text) {
    this.messages.push({ role: "user", content: text });
    const item = this.#item("user", "You");
    item.append(element("div", "content", text));
  }

  /** A view for the next answer; `startedAt` is when Enter was pressed (performance.now()). */
  startAnswer(startedAt, via) {
    return new AnswerView(this.#item("assistant", "rill"), startedAt, via, (message) => this.messages.push(message));
  }

  clear() {
    this.messages = [];
    this.list.replaceChildren();
  }

  #item(role, who) {
    const item = element("li", `msg ${role}`);
    item.append(element("span", "who", who));
    this.list.append(item);
    return item;
  }
}

export class AnswerView {
  constructor(item, startedAt, via, keep) {
    this.item = item;
    this.startedAt = startedAt;
    this.via = via;
    this.after = "Enter";  // what the time to the first token is counted from
    this.keep = keep;
    this.firstTokenAt = null;
    this.content = "";
    this.calls = [];  // {id, name, args, code}
    this.item.setAttribute("aria-busy", "true");
    this.body = element("div", "content");
    this.item.append(this.body);
  }

  get ttftMs() {
    return this.firstTokenAt === null ? null : this.firstTokenAt - this.startedAt;
  }

  reasoning(delta) {
    this.#arrived();
    if (!this.reasoningText) {
      const details = element("details");
      details.append(element("summary", null, "Reasoning"));
      this.reasoningText = element("div", "reasoning");
      details.append(this.reasoningText);
      this.item.insertBefore(details, this.body);
    }
    this.reasoningText.textContent += delta;
  }

  text(delta) {
    this.#arrived();
    this.content += delta;
    this.body.textContent = this.content;
  }

  /** A tool call's first fragment carries id and name; later ones only argument text. */
  toolCall(index, { id, name, args }) {
    this.#arrived();
    let call = this.calls[index];
    if (!call) {
      const box = element("div", "tool-call");
      box.setAttribute("role", "group");
      box.setAttribute("aria-label", `Tool call ${name ?? ""}`);
      box.append(element("span", "label", "Tool call"));
      call = this.calls[index] = { id, name: name ?? "", args: "", code: element("code") };
      box.append(call.code);
      this.item.append(box);
    }
    call.args += args;
    call.code.textContent = `${call.name}(${call.args})`;
  }

  /** The stats line: tokens, time to first token, tokens/s; the message joins the conversation. */
  finish({ tokens, status }) {
    const endedAt = performance.now();
    const parts = [];
    if (tokens !== null) parts.push(`${tokens} tokens`);
    if (this.ttftMs !== null) parts.push(`first token ${Math.round(this.ttftMs)} ms after ${this.after}`);
    const decodeS = (endedAt - (this.firstTokenAt ?? endedAt)) / 1000;
    if (tokens > 1 && decodeS > 0) parts.push(`${((tokens - 1) / decodeS).toFixed(0)} tokens/s`);
    parts.push(`via ${this.via}`);
    if (status && status !== "stop" && status !== "completed") parts.push(status);
    this.#stats(parts.join(" · "), false);
    this.keep(this.message());
  }

  fail(message) {
    this.#stats(`error: ${message}`, true);
  }

  message() {
    const message = { role: "assistant", content: this.content };
    const calls = this.calls.filter(Boolean);
    if (calls.length) {
      message.tool_calls = calls.map((c, i) => ({ id: c.id ?? `call_${i}`, type: "function",
                                                  function: { name: c.name, arguments: c.args } }));
    }
    return message;
  }

  #arrived() {
    if (this.firstTokenAt === null) this.firstTokenAt = performance.now();
  }

  #stats(text, isError) {
    this.item.removeAttribute("aria-busy");
    this.item.append(element("div", isError ? "stats error" : "stats", text));
  }
}

function element(tag, className = null, text = null) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== null) node.textContent = text;
  return node;
}
