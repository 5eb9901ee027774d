// One answer over POST /v1/chat/completions with "stream": true, read with fetch and a
// ReadableStream (EventSource cannot POST). Stopping aborts the fetch; the server sees the
// connection go and aborts the request, whose KV is free by the engine's next step.

import { checkResponse, headers } from "./api.js";
import { readFrames } from "./sse.js";

// rill-tiny was trained to call these (src/rill/tiny/tasks.py); any model may get them.
export const TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the current weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
  { type: "function", function: { name: "get_time", description: "Get the current time in a timezone.",
    parameters: { type: "object", properties: { timezone: { type: "string" } }, required: ["timezone"] } } },
];

export function chatBody(settings, messages) {
  const body = {
    ...settings.extra,
    model: settings.model, messages, stream: true, stream_options: { include_usage: true },
    temperature: settings.temperature, max_tokens: settings.maxTokens,
  };
  if (settings.tools) body.tools = TOOLS;
  return body;
}

/** Stream one answer into `answer` (an AnswerView); resolves to {tokens, status} at [DONE]. */
export async function streamChat(body, answer, signal) {
  const response = await checkResponse(await fetch("v1/chat/completions", {
    method: "POST", body: JSON.stringify(body), signal,
    headers: headers({ "Content-Type": "application/json" }),
  }));
  let usage = null;
  let finish = null;
  for await (const frame of readFrames(response)) {
    if (frame.data === "[DONE]") break;
    const chunk = JSON.parse(frame.data);
    if (frame.event === "error" || chunk.error) throw new Error(chunk.error?.message ?? frame.data);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices ?? []) {
      applyDelta(answer, choice.delta ?? {});
      finish = choice.finish_reason ?? finish;
    }
  }
  return { tokens: usage?.completion_tokens ?? null, status: finish ?? "incomplete" };
}

function applyDelta(answer, delta) {
  const reasoning = delta.reasoning_content ?? delta.reasoning;
  if (reasoning) answer.reasoning(reasoning);
  if (delta.content) answer.text(delta.content);
  for (const call of delta.tool_calls ?? []) {
    answer.toolCall(call.index, { id: call.id, name: call.function?.name, args: call.function?.arguments ?? "" });
  }
}
