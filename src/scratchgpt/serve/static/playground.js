// The scratchgpt playground: plain JavaScript against the server's own API, nothing fetched
// from anywhere else. Complete: streamed tokens coloured by probability, alternatives on
// hover. Chat: the same for chat-tuned models. Attention: a GPT's attention as a heatmap.
"use strict";

const $ = (id) => document.getElementById(id);
let model = null; // the server's /v1/models entry
// The request in flight in each tab (its AbortController), or null: one at a time per tab,
// its Stop button aborts it.
const running = {complete: null, chat: null};
const BUTTONS = {complete: {go: "generate", stop: "stop-generating"},
                 chat: {go: "chat-send", stop: "chat-stop"}};
let promptText = "";
let generatedText = "";
let messages = []; // the chat so far, as the model sees it
const bubbleOf = new WeakMap(); // a message of the chat: its bubble in the log

// ---- talking to the server

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// The server is out of reach (stopped, or the network down): the browser's own words for it
// ("Failed to fetch") do not say which end failed.
const UNREACHABLE = "cannot reach the server: is scratchgpt serve still running?";
// A 401: the server's own words name an HTTP header, which a page's user never writes.
const NEEDS_KEY = "this server needs its API key (serve --api-key): type it in the box at " +
  "the top right";
const WRONG_KEY = "the API key in the box at the top right is not this server's";
const CUT_SHORT = "the connection to the server was lost before the text was finished";

async function request(path, body, signal) {
  let response;
  try {
    response = await fetch(path, {
      method: body ? "POST" : "GET", headers: headers(), signal,
      body: body ? JSON.stringify(body) : undefined,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Error(UNREACHABLE);
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    let code = null;
    try {
      const error = (await response.json()).error;
      message = error.message;
      code = error.code;
    } catch (e) { /* not JSON */ }
    if (response.status === 401) message = $("api-key").value.trim() ? WRONG_KEY : NEEDS_KEY;
    throw Object.assign(new Error(message), {status: response.status, code});
  }
  return response;
}

// The next piece of a response's body; a connection lost mid-stream (the server stopped,
// the network cut) is an error that says so, as is a body that ends before "data: [DONE]"
// (it read as a stream that finished).
async function readPiece(reader) {
  let piece;
  try {
    piece = await reader.read();
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Error(CUT_SHORT);
  }
  if (piece.done) throw new Error(CUT_SHORT);
  return piece.value;
}

// Server-sent events: onEvent(object) for each "data:" line until "data: [DONE]".
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const value = await readPiece(reader);
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") return;
        const data = JSON.parse(line.slice(6));
        if (data.error) throw new Error(data.error.message);
        onEvent(data);
      }
    }
  }
}

// The number fields of the settings and what each takes. Every one must hold such a number,
// but the seed, whose empty field means a random seed (as its placeholder says): an empty or
// invalid field is marked and named under the settings, and nothing is sent until it is
// fixed (an empty temperature was sent as 0, greedy; an empty max tokens as 16).
const NUMBER_FIELDS = [
  {id: "max-tokens", name: "max tokens", whole: true, min: 1, takes: "a whole number, 1 or more"},
  {id: "temperature", name: "temperature", min: 0, max: 2, takes: "a number from 0 to 2 (0: greedy)"},
  {id: "top-p", name: "top-p", min: 0, above: true, max: 1,
   takes: "a number above 0, at most 1 (1: off)"},
  {id: "top-k", name: "top-k", whole: true, min: 0, takes: "a whole number, 0 or more (0: off)"},
  {id: "seed", name: "seed", whole: true, min: 0, empty: null,
   takes: "a whole number, 0 or more, or nothing for a random seed"},
];

// A number field's value (null: empty where that is allowed), or {error} saying what is wrong.
function readNumber(f) {
  const input = $(f.id);
  // a number field holding text that is no number reads as "" and flags badInput
  if (input.validity.badInput) return {error: `${f.name} is not a number: write ${f.takes}`};
  if (input.value.trim() === "") {
    return "empty" in f ? {value: f.empty} : {error: `${f.name} is empty: write ${f.takes}`};
  }
  const v = Number(input.value);
  const wrong = !Number.isFinite(v) || (f.whole && !Number.isInteger(v)) || v < f.min ||
    (f.above && v === f.min) || (f.max !== undefined && v > f.max);
  return wrong ? {error: `${f.name} ${input.value} is out of range: write ${f.takes}`} : {value: v};
}

// Check every number field: each wrong one is marked and its error shown under the
// settings. The values by field id, or null when any is wrong.
function checkNumbers() {
  const values = {};
  const errors = [];
  for (const f of NUMBER_FIELDS) {
    const {value, error} = readNumber(f);
    $(f.id).classList.toggle("invalid", !!error);
    $(f.id).setAttribute("aria-invalid", error ? "true" : "false");
    if (error) errors.push(error);
    else values[f.id] = value;
  }
  $("settings-error").textContent = errors.join("; ");
  $("settings-error").hidden = !errors.length;
  return errors.length ? null : values;
}

// The request's sampling settings, or null (the wrong fields marked) when a number field is
// empty or invalid.
function settings() {
  const n = checkNumbers();
  if (!n) return null;
  const s = {max_tokens: n["max-tokens"], temperature: n.temperature};
  if (n["top-p"] < 1) s.top_p = n["top-p"];
  if (n["top-k"] > 0) s.top_k = n["top-k"];
  if (n.seed !== null) s.seed = n.seed;
  const stop = $("stop").value.replace(/\\n/g, "\n").replace(/\\t/g, "\t");
  if (stop) s.stop = [stop];
  if (model) s.model = model.id;
  return s;
}

// ---- tokens coloured by probability

function colour(p) {
  return `hsl(${Math.round(120 * Math.min(1, Math.max(0, p)))}, 75%, 82%)`;
}

function visible(text) {
  return text.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205";
}

// A span for one token: its text, coloured by exp(logprob); alternatives for the tooltip.
function tokenSpan(text, logprob, alternatives) {
  const span = document.createElement("span");
  span.className = "tok";
  span.textContent = text === "\n" ? "\u21b5\n" : text;
  span.style.background = colour(Math.exp(logprob));
  span.tokenText = text;
  span.logprob = logprob;
  span.alternatives = alternatives;
  return span;
}

// Append a chunk's text as token spans. tokens: [{token, logprob, alternatives}] whose texts
// make up `text` (the last one may be cut short where a stop string began).
function appendTokens(box, text, tokens) {
  let pos = 0;
  tokens.forEach((t, i) => {
    const last = i === tokens.length - 1;
    const piece = last ? text.slice(pos) : text.substr(pos, t.token.length);
    pos += piece.length;
    if (piece) box.appendChild(tokenSpan(piece, t.logprob, t.alternatives));
  });
  if (pos < text.length) box.appendChild(document.createTextNode(text.slice(pos)));
}

function showTooltip(span, x, y) {
  const tip = $("tooltip");
  const p = Math.exp(span.logprob);
  const rows = (span.alternatives || []).map((a) => {
    const q = Math.exp(a.logprob);
    const cls = a.token === span.tokenText ? "alt chosen" : "alt";
    return `<div class="${cls}"><span>${escapeHtml(visible(a.token))}</span>` +
           `<span class="bar" style="width:${(100 * q).toFixed(1)}%"></span>` +
           `<span>${(100 * q).toFixed(1)}%</span></div>`;
  });
  tip.innerHTML = `<div class="title">chose <b>${escapeHtml(visible(span.tokenText))}</b> ` +
                  `at ${(100 * p).toFixed(1)}%; the most likely tokens:</div>` + rows.join("");
  tip.hidden = false;
  tip.style.left = Math.min(x + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
  tip.style.top = Math.min(y + 14, window.innerHeight - tip.offsetHeight - 8) + "px";
}

function escapeHtml(s) {
  return s.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
}

document.addEventListener("mouseover", (e) => {
  if (e.target.classList && e.target.classList.contains("tok")) {
    showTooltip(e.target, e.clientX, e.clientY);
  }
});
document.addEventListener("mouseout", (e) => {
  if (e.target.classList && e.target.classList.contains("tok")) $("tooltip").hidden = true;
});

// Start a request of `tab`: its AbortController, or null while one of that tab is running
// (a second click, or Enter pressed again, starts nothing).
function begin(tab) {
  if (running[tab]) return null;
  const controller = running[tab] = new AbortController();
  $(BUTTONS[tab].go).disabled = true;
  $(BUTTONS[tab].stop).disabled = false;
  return controller;
}

// The request `controller` of `tab` ended (done, failed or stopped).
function end(tab, controller) {
  if (running[tab] !== controller) return;
  running[tab] = null;
  $(BUTTONS[tab].go).disabled = tab === "chat" && !chatAvailable();
  $(BUTTONS[tab].stop).disabled = true;
}

function stop(tab) {
  if (running[tab]) running[tab].abort();
}

function chatAvailable() {
  return !model || !!model.chat_template;
}

function setStatus(id, text, error) {
  $(id).textContent = text;
  $(id).classList.toggle("error", !!error);
}

// ---- Complete

async function generate() {
  if (running.complete) return;
  const sampling = settings();
  if (!sampling) return;
  const controller = begin("complete");
  if (!controller) return;
  const out = $("output");
  out.textContent = "";
  promptText = $("prompt").value;
  generatedText = "";
  const shown = document.createElement("span");
  shown.className = "prompt";
  shown.textContent = promptText;
  out.appendChild(shown);
  setStatus("status", "waiting for the first token…");
  const start = performance.now();
  let count = 0;
  let finish = null;
  try {
    const response = await request("/v1/completions", {
      ...sampling, prompt: promptText, stream: true, logprobs: 5,
    }, controller.signal);
    await readEvents(response, (chunk) => {
      const choice = chunk.choices[0];
      if (!choice) return;
      const lp = choice.logprobs || {tokens: [], token_logprobs: [], top_logprobs: []};
      const tokens = lp.tokens.map((t, i) => ({
        token: t, logprob: lp.token_logprobs[i],
        alternatives: Object.entries(lp.top_logprobs[i] || {})
          .map(([token, logprob]) => ({token, logprob})),
      }));
      appendTokens(out, choice.text, tokens);
      generatedText += choice.text;
      count += tokens.length;
      finish = choice.finish_reason || finish;
      const rate = count / ((performance.now() - start) / 1000);
      setStatus("status", `${count} tokens, ${rate.toFixed(1)} tokens/s`);
    });
    setStatus("status", `${count} tokens — finished (${finish || "stopped"})`);
  } catch (e) {
    if (e.name === "AbortError") setStatus("status", `${count} tokens — stopped`);
    else setStatus("status", e.message, true);
  } finally {
    end("complete", controller);
  }
}

// ---- Chat

function chatBubble(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  if (text) div.textContent = text;
  $("chat-log").appendChild(div);
  return div;
}

// True when the server refused a request for being longer than the model's context: told
// by OpenAI's error code, since its status (400) is also that of any wrong field.
function tooLong(error) {
  return error.code === "context_length_exceeded";
}

// Drop the oldest user message and its reply from `sent` (a system message first stays, and
// so does the newest user message): false when there is nothing left to drop.
function dropOldestTurn(sent) {
  const first = sent.length && sent[0].role === "system" ? 1 : 0;
  if (sent.length - first <= 1) return false;
  sent.splice(first, 2);
  return true;
}

// POST the chat `sent`, dropping its oldest turns while the server answers that it outgrows
// the context (as `scratchgpt chat` does); `sent` is left as the messages the server took.
// Too long a newest message alone fails with the server's error.
async function requestChat(sent, sampling, signal) {
  for (;;) {
    try {
      return await request("/v1/chat/completions", {
        ...sampling, messages: sent, stream: true, logprobs: true, top_logprobs: 5,
      }, signal);
    } catch (e) {
      if (!tooLong(e) || !dropOldestTurn(sent)) throw e;
    }
  }
}

// Keep the exchange `sent` + `reply` as the conversation; the messages of `conversation`
// that the request left out are greyed in the log, a note saying why.
function keepExchange(conversation, sent, reply, asked, bubble) {
  const kept = new Set(sent);
  const dropped = conversation.filter((m) => !kept.has(m));
  for (const m of dropped) {
    const div = bubbleOf.get(m);
    if (div) {
      div.classList.add("dropped");
      div.title = "left out of what the model sees: the conversation outgrew its context";
    }
  }
  if (dropped.length) {
    const note = document.createElement("div");
    note.className = "note";
    note.textContent = `${dropped.length} older messages no longer fit the model's context: ` +
      "they are left out of what it sees (greyed above)";
    $("chat-log").insertBefore(note, asked);
  }
  const answer = {role: "assistant", content: reply};
  bubbleOf.set(sent[sent.length - 1], asked);
  bubbleOf.set(answer, bubble);
  conversation.splice(0, conversation.length, ...sent, answer);
}

// A reply is kept in the conversation when it streamed (or was stopped part-way); a request
// that failed (a message too long for the context, a missing API key, a busy server) leaves
// the conversation as it was, its message marked in the log, so the next message is not sent
// after it. Stop keeps the reply so far as what the assistant said (as Ctrl-C does in
// `scratchgpt chat`). "New chat" during a reply stops it, and the old reply stays out of the
// new chat. A conversation longer than the context loses its oldest turns (requestChat).
async function sendChat() {
  const content = $("chat-message").value;
  if (!content.trim() || !chatAvailable() || running.chat) return;
  const sampling = settings(); // wrong settings: the message stays in its box, unsent
  if (!sampling) return;
  const controller = begin("chat");
  if (!controller) return;
  $("chat-message").value = "";
  const conversation = messages;
  const sent = [...conversation, {role: "user", content}];
  const asked = chatBubble("user", content);
  const bubble = chatBubble("assistant", "");
  let reply = "";
  let failed = false;
  try {
    const response = await requestChat(sent, sampling, controller.signal);
    await readEvents(response, (chunk) => {
      const choice = chunk.choices[0];
      if (!choice || !choice.delta) return;
      const text = choice.delta.content || "";
      const tokens = ((choice.logprobs && choice.logprobs.content) || []).map((t) => ({
        token: t.token, logprob: t.logprob, alternatives: t.top_logprobs,
      }));
      appendTokens(bubble, text, tokens);
      reply += text;
    });
  } catch (e) {
    failed = e.name !== "AbortError";
    if (failed) {
      bubble.classList.add("error");
      bubble.textContent = `${e.message} (not part of the conversation)`;
      asked.classList.add("unsent");
    } else if (!reply) {
      bubble.textContent = "(stopped)";
    }
  } finally {
    if (!failed && messages === conversation) {
      keepExchange(conversation, sent, reply, asked, bubble);
    }
    end("chat", controller);
  }
}

function newChat() {
  stop("chat");
  messages = [];
  $("chat-log").textContent = "";
}

// ---- Attention

async function showAttention() {
  const text = promptText + generatedText || $("prompt").value;
  if (!text) {
    setStatus("attention-status", "write a prompt in the Complete tab first", true);
    return;
  }
  const layer = $("layer").value === "" ? null : +$("layer").value;
  const head = $("head").value === "" ? null : +$("head").value;
  setStatus("attention-status", "computing…");
  try {
    const response = await request("/api/attention", {text, layer, head});
    const data = await response.json();
    drawHeatmap(data);
    const note = data.truncated ? ` (the first ${data.tokens.length} tokens)` : "";
    setStatus("attention-status", `${data.tokens.length} tokens${note}, layer ` +
              `${layer === null ? "mean" : layer}, head ${head === null ? "mean" : head}`);
  } catch (e) {
    setStatus("attention-status", e.message, true);
  }
}

function heatColour(w) {
  const v = Math.sqrt(Math.max(0, Math.min(1, w))); // sqrt: small weights stay visible
  return `rgb(${Math.round(255 - v * 225)},${Math.round(255 - v * 195)},${Math.round(255 - v * 95)})`;
}

function drawHeatmap(data) {
  const canvas = $("heatmap");
  const n = data.tokens.length;
  const cell = Math.max(3, Math.min(22, Math.floor(640 / n)));
  const labels = cell >= 10;
  const margin = labels ? 70 : 4;
  canvas.width = margin + n * cell + 4;
  canvas.height = margin + n * cell + 4;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      ctx.fillStyle = j > i ? "#eef0f4" : heatColour(data.weights[i][j]);
      ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
    }
  }
  if (labels) {
    ctx.fillStyle = "#1d2330";
    ctx.font = `${Math.min(12, cell)}px ui-monospace, monospace`;
    ctx.textBaseline = "middle";
    data.tokens.forEach((t, i) => {
      ctx.textAlign = "right";
      ctx.fillText(t.slice(0, 8), margin - 4, margin + i * cell + cell / 2);
      ctx.save();
      ctx.translate(margin + i * cell + cell / 2, margin - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(t.slice(0, 8), 0, 0);
      ctx.restore();
    });
  }
  canvas.dataset.tokens = n;
  canvas.onmousemove = (e) => {
    const r = canvas.getBoundingClientRect();
    const j = Math.floor((e.clientX - r.left - margin) / cell);
    const i = Math.floor((e.clientY - r.top - margin) / cell);
    if (i < 0 || j < 0 || i >= n || j >= n) return;
    $("attention-cell").textContent = j > i
      ? `token ${i} (${data.tokens[i]}) cannot see the later token ${j}`
      : `token ${i} (${data.tokens[i]}) gives ${(100 * data.weights[i][j]).toFixed(1)}% ` +
        `of its attention to token ${j} (${data.tokens[j]})`;
  };
}

// ---- start-up

// Show tab `name`. The sampling settings belong to Complete and Chat: the Attention tab
// reads the Complete tab's text and samples nothing, so they are hidden there.
function showTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => {
    b.classList.toggle("active", b.dataset.tab === name);
  });
  document.querySelectorAll(".tab").forEach((s) => { s.hidden = s.id !== `tab-${name}`; });
  $("settings").hidden = name === "attention";
}

function fillSelect(select, count) {
  select.innerHTML = '<option value="">mean</option>' +
    Array.from({length: count}, (_, i) => `<option value="${i}">${i}</option>`).join("");
}

async function loadModel() {
  try {
    const data = await (await request("/v1/models")).json();
    model = data.data[0];
    const ctx = model.context_length ? `, context ${model.context_length}` : "";
    $("model-card").textContent = `${model.id}: ${model.model_type}, vocabulary ` +
      `${model.vocab_size}${ctx}, ${model.dtype}` + (model.chat_template ? ", chat" : "");
    $("chat-unavailable").hidden = !!model.chat_template;
    $("chat-send").disabled = !model.chat_template || !!running.chat;
    $("attention-unavailable").hidden = !!model.attention;
    $("attention-show").disabled = !model.attention;
    if (model.attention) {
      fillSelect($("layer"), model.n_layer);
      fillSelect($("head"), model.n_head);
    }
  } catch (e) {
    // an unreachable server and a missing key say so themselves: the server was reached
    // when it asked for a key ("cannot reach the model" said otherwise)
    $("model-card").textContent = !e.status || e.status === 401 ? e.message
      : `cannot read the model: ${e.message}`;
  }
}

document.querySelectorAll("#tabs button").forEach((b) => {
  b.addEventListener("click", () => showTab(b.dataset.tab));
});
$("generate").addEventListener("click", generate);
$("stop-generating").addEventListener("click", () => stop("complete"));
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate();
});
$("chat-send").addEventListener("click", sendChat);
$("chat-stop").addEventListener("click", () => stop("chat"));
$("chat-message").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); sendChat(); }
});
$("chat-clear").addEventListener("click", newChat);
$("attention-show").addEventListener("click", showAttention);
for (const f of NUMBER_FIELDS) $(f.id).addEventListener("input", checkNumbers);
$("api-key").value = localStorage.getItem("scratchgpt-api-key") || "";
$("api-key").addEventListener("change", () => {
  localStorage.setItem("scratchgpt-api-key", $("api-key").value.trim());
  loadModel();
});
loadModel();
