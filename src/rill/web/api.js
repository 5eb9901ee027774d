// The server's HTTP API as the page uses it: the API key (kept in this tab's sessionStorage),
// JSON GETs, error messages from OpenAI-shaped error bodies, and the realtime WebSocket's address.
// Paths are relative, so the page also works behind a proxy that mounts rill under a prefix.

const KEY_ITEM = "rill.apiKey";
const INSECURE_KEY_PROTOCOL = "openai-insecure-api-key.";  // browsers cannot set a WebSocket's headers

export class Unauthorized extends Error {}

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function setApiKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

/** The message of an OpenAI-shaped error body, or the HTTP status line. */
export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message ?? `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

/** Throws Unauthorized on 401 so that the page can ask for a key and try again. */
export async function checkResponse(response) {
  if (response.status === 401) throw new Unauthorized(await errorMessage(response));
  if (!response.ok) throw new Error(await errorMessage(response));
  return response;
}

export async function getJSON(path) {
  const response = await checkResponse(await fetch(path, { headers: headers() }));
  return response.json();
}

export function realtimeURL(path = "v1/realtime") {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

/** rill answers with the `realtime` subprotocol, never echoing the key. */
export function realtimeProtocols() {
  const key = apiKey();
  return key ? ["realtime", INSECURE_KEY_PROTOCOL + key] : ["realtime"];
}


/** Settle an answer's {resolve, reject} from a realtime response.done: rejected when the response
 * failed, else resolved with its output tokens and the finish reason as the chat view words it. */
export function settleAnswer(answer, response) {
  if (response.status === "failed") {
    answer.reject(new Error(response.status_details?.error?.message ?? "the response failed"));
    return;
  }
  const status = { completed: "stop", cancelled: "stopped", incomplete: "length" }[response.status];
  answer.resolve({ tokens: response.usage?.output_tokens ?? null, status: status ?? response.status });
}
