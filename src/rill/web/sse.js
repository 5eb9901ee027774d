// Server-Sent Events from fetch: a ReadableStream of bytes -> {event, data} frames (the parts of
// the SSE format OpenAI streams use: `event:` and `data:` fields, a blank line ends a frame).

/** Complete frames at the start of `buffer`, and the incomplete rest. */
export function splitFrames(buffer) {
  const text = buffer.replace(/\r\n?/g, "\n");
  const blocks = text.split("\n\n");
  const rest = blocks.pop();
  return { frames: blocks.filter((b) => b.trim()).map(parseFrame), rest };
}

function parseFrame(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;  // a comment (keepalive)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  return { event, data: data.join("\n") };
}

/** Frames of a fetch Response's body as they arrive; ends with the body. */
export async function* readFrames(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const { frames, rest } = splitFrames(buffer + value);
      buffer = rest;
      yield* frames;
    }
  } finally {
    reader.releaseLock();
  }
}
