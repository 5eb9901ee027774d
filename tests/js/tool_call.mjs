// The openai JS SDK against a live rill server, as its README shows for an OpenAI-compatible one:
// ask, run the tool the model calls, send its result back as compact JSON (JSON.stringify), and
// print what happened as one JSON line for tests/test_frameworks.py to check.
// Usage: node tool_call.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city.",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

function getWeather({ city }) {
  return { temperature_c: 21, condition: "sunny", city };
}

const messages = [{ role: "user", content: "What's the weather in Paris?" }];
const first = await client.chat.completions.create({ model, messages, tools, temperature: 0, max_tokens: 60 });
const message = first.choices[0].message;
const calls = message.tool_calls ?? [];
const report = { calls: calls.map((c) => c.function), first_content: message.content, answer: null };
if (calls.length > 0) {
  messages.push(message);
  for (const call of calls) {
    const { temperature_c, condition } = getWeather(JSON.parse(call.function.arguments));
    // Compact JSON, no spaces: what JSON.stringify gives, unlike Python's json.dumps.
    messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify({ temperature_c, condition }) });
  }
  const second = await client.chat.completions.create({ model, messages, tools, temperature: 0, max_tokens: 60 });
  report.answer = second.choices[0].message.content;
}
console.log(JSON.stringify(report));
