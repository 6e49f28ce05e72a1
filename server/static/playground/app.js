// tgserve playground: chat over /v1/chat/completions with streamed tokens, per-answer figures,
// and the server's running / waiting / KV-cache gauges from /metrics.
// Every URL is relative to the page (so it works behind a path prefix); the API key lives in
// this page's memory only (never stored), sent as "Authorization: Bearer <key>".
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];  // the conversation: {role, content} (and tool_calls) messages
let running = null;  // the AbortController of the answer being streamed

function headers() {
  const key = $("api-key").value.trim();
  const out = { "content-type": "application/json" };
  if (key) out.authorization = "Bearer " + key;
  return out;
}

// A failed turn's error, shown in the conversation where the turn was (role "alert": read out);
// it is not part of the history, and the next question removes it.
function showError(text) {
  const node = addMessage("error", text);
  node.parentNode.setAttribute("role", "alert");
}

function clearErrors() {
  for (const node of document.querySelectorAll("#messages .message.error")) node.remove();
}

async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error;
    return response.status + ": " + (typeof error === "string" ? error : error.message);
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

function addMessage(role, text) {
  const node = document.createElement("div");
  node.className = "message " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "content";
  body.textContent = text;
  node.append(label, body);  // body.parentNode: the bubble, to remove or restyle
  $("messages").append(node);
  node.scrollIntoView({ block: "end" });
  return body;
}

// The request body from the options panel; a bad JSON field is reported, not sent.
function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  const body = {
    messages: messages.concat(history),
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    top_p: Number($("top_p").value),
    max_tokens: Number($("max_tokens").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  const stops = $("stop-strings").value.split("\n").filter((s) => s.length > 0);
  if (stops.length) body.stop = stops;
  const schema = $("schema").value.trim();
  if (schema) {
    body.response_format = { type: "json_schema", json_schema: { name: "answer", schema: JSON.parse(schema) } };
  }
  const tools = $("tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);
  return body;
}

// Server-sent events from a fetch body: calls onEvent(parsed JSON) for each "data:" line.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data !== "[DONE]") onEvent(JSON.parse(data));
      }
    }
  }
}

function showFigures(sent, first, last, tokens, finish) {
  $("ttft").textContent = first ? ((first - sent) / 1000).toFixed(3) + " s" : "–";
  $("tokens").textContent = String(tokens);
  const span = (last - first) / 1000;
  $("tps").textContent = tokens > 1 && span > 0 ? ((tokens - 1) / span).toFixed(1) : "–";
  $("finish").textContent = finish || "–";
}

// Whether the turn's request failed (its bubbles are removed, its prompt given back) or the
// user stopped it (what was shown stays, as the history's answer).
async function ask(prompt) {
  clearErrors();
  let body;
  try {
    history.push({ role: "user", content: prompt });
    body = requestBody();
  } catch (err) {
    history.pop();
    $("prompt").value = prompt;
    showError("Options: " + err.message);
    return;
  }
  const question = addMessage("user", prompt).parentNode;
  const answer = addMessage("assistant", "");
  answer.parentNode.classList.add("waiting");  // until the first token: a pulsing "…"
  running = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const sent = performance.now();
  let first = 0, last = 0, chunks = 0, usage = null, finish = null, text = "";
  const calls = [];
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: running.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await readEvents(response, (chunk) => {
      if (chunk.error) throw new Error("the answer failed: " + chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) {  // the last chunk: usage alone, the count of tokens the server gives
        showFigures(sent, first, last, usage ? usage.completion_tokens : chunks, finish);
        return;
      }
      const delta = choice.delta || {};
      const piece = (delta.content || "") + (delta.reasoning_content || "");
      for (const call of delta.tool_calls || []) {
        calls[call.index] = calls[call.index] || { name: "", arguments: "" };
        if (call.function && call.function.name) calls[call.index].name += call.function.name;
        if (call.function && call.function.arguments) calls[call.index].arguments += call.function.arguments;
      }
      if (piece || delta.tool_calls) {
        const now = performance.now();
        if (!first) {
          first = now;
          answer.parentNode.classList.remove("waiting");
        }
        last = now;
        chunks += 1;
        text += piece;
        answer.textContent = text + calls.map((c) => "\n→ " + c.name + "(" + c.arguments + ")").join("");
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      showFigures(sent, first, last, usage ? usage.completion_tokens : chunks, finish);
    });
    const message = { role: "assistant", content: text };
    if (calls.length) message.tool_calls = calls.map((c, i) => ({ id: "call_" + i, type: "function", function: c }));
    history.push(message);
  } catch (err) {
    answer.parentNode.classList.remove("waiting");
    if (err.name === "AbortError" && (text || calls.length)) {
      history.push({ role: "assistant", content: text });  // stopped: keep what was shown
    } else {
      history.pop();  // the turn's question: failed or stopped before any token
      question.remove();
      answer.parentNode.remove();
      if (err.name !== "AbortError") {
        if (!$("prompt").value) $("prompt").value = prompt;  // to edit and send again
        showError(err.message);
      }
    }
  } finally {
    running = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

// Prometheus text -> the first sample of each named metric (no labels needed here).
function samples(text, names) {
  const out = {};
  for (const line of text.split("\n")) {
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([^ ]+)/.exec(line);
    if (match && names.includes(match[1]) && !(match[1] in out)) out[match[1]] = Number(match[3]);
  }
  return out;
}

async function pollServer() {
  try {
    const response = await fetch("metrics", { headers: headers() });
    if (!response.ok) return;
    const names = ["tgserve_num_requests_running", "tgserve_num_requests_waiting",
      "tgserve_kv_cache_blocks_used", "tgserve_kv_cache_blocks"];
    const got = samples(await response.text(), names);
    if (names[0] in got) $("running").textContent = String(got[names[0]]);
    if (names[1] in got) $("waiting").textContent = String(got[names[1]]);
    if (got[names[3]]) {
      const used = got[names[2]], pool = got[names[3]];
      $("kv").textContent = (100 * used / pool).toFixed(1) + " % (" + used + " / " + pool + " blocks)";
    }
  } catch (_) { /* the server is restarting: the next poll tries again */ }
}

async function loadInfo() {
  const response = await fetch("info", { headers: headers() });
  if (!response.ok) {
    $("model").textContent = "model: " + (response.status === 401 ? "enter the API key" : "not ready (" + response.status + ")");
    return false;
  }
  const info = await response.json();
  $("model").textContent = "model: " + info.model_id;
  $("info").textContent = JSON.stringify(info, null, 1);
  return true;
}

async function keepLoadingInfo() {
  if (!(await loadInfo())) setTimeout(keepLoadingInfo, 2000);
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const prompt = $("prompt").value;
  if (!prompt.trim() || running) return;
  $("prompt").value = "";
  ask(prompt);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("ask").requestSubmit();
  }
});
$("stop").addEventListener("click", () => running && running.abort());
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("messages").textContent = "";
});
$("api-key").addEventListener("change", loadInfo);
keepLoadingInfo();
pollServer();
setInterval(pollServer, 2000);
