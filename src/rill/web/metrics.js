// The live panel: GET /metrics (Prometheus text, open without an API key) every POLL_MS.

const POLL_MS = 2000;

/** name -> value, summed over label sets (the panel reads unlabelled gauges and counters). */
export function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (match) values.set(match[1], (values.get(match[1]) ?? 0) + Number(match[3]));
  }
  return values;
}

/** Poll forever, writing into the panel's fields; a failed poll says so and the next one retries. */
export function startMetrics(fields, status) {
  let previous = null;  // {tokens, at}
  const poll = async () => {
    try {
      const response = await fetch("metrics", { cache: "no-store" });
      if (!response.ok) throw new Error(`${response.status}`);
      const values = parseMetrics(await response.text());
      const at = performance.now();
      const tokens = values.get("rill_generation_tokens_total") ?? 0;
      show(fields, values, previous && (tokens - previous.tokens) / ((at - previous.at) / 1000));
      previous = { tokens, at };
      status.textContent = "from /metrics every 2 s";
    } catch (error) {
      status.textContent = `/metrics unreachable (${error.message}); retrying`;
    } finally {
      setTimeout(poll, POLL_MS);
    }
  };
  poll();
}

function show(fields, values, tokensPerS) {
  const number = (name) => values.get(name) ?? 0;
  fields.running.textContent = number("rill_num_requests_running");
  fields.waiting.textContent = number("rill_num_requests_waiting");
  fields.kv.textContent = `${(100 * number("rill_kv_cache_usage_ratio")).toFixed(1)} %`;
  fields.tps.textContent = tokensPerS === null ? "–" : Math.max(0, tokensPerS).toFixed(0);
  fields.realtime.textContent = `${number("rill_realtime_connections_open")} open`;
}
