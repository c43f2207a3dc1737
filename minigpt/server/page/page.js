// minigpt's page: a prompt streamed through /v1/completions, each token coloured by its probability,
// its alternatives on hover or focus, its attention on click, and the engine's state from /metrics.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { ids: [], texts: [], model: null, selected: null, names: new Map(), running: false };
const END_OF_TEXT = 50256;  // GPT-2's <|endoftext|>: what the model is fed for an empty prompt (echo shows nothing)

async function post(path, body) {
  const response = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
                                       body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error ? answer.error.message : response.statusText);
  return answer;
}

function idOf(token) { return Number(token.slice("token_id:".length)); }

async function textOf(id) {  // a token's text, asked of /detokenize once
  if (!state.names.has(id)) state.names.set(id, (await post("/detokenize", { tokens: [id] })).prompt);
  return state.names.get(id);
}

function colour(p) { return `hsl(${Math.round(120 * p)}, 75%, 82%)`; }

function probability(logprob) {  // as the page shows it: small ones in exponent form
  const p = Math.exp(logprob);
  return p >= 0.001 ? p.toFixed(3) : p.toExponential(1);
}

function addToken(id, text, logprob, top, prompt) {
  const span = document.createElement("span");
  span.className = "token " + (prompt ? "prompt" : "generated");
  span.textContent = text;
  span.tabIndex = 0;
  span.dataset.tokenId = String(id);
  span.dataset.position = String(state.ids.length);
  if (!prompt) {
    span.dataset.logprob = String(logprob);
    span.style.background = colour(Math.exp(logprob));
    span.title = `p = ${probability(logprob)}`;
    span.alternatives = top;
    span.addEventListener("mouseenter", () => showAlternatives(span));
    span.addEventListener("focus", () => showAlternatives(span));
  }
  span.addEventListener("click", () => showAttention(span));
  span.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); showAttention(span); } });
  state.ids.push(id);
  state.texts.push(text);
  $("output").append(span);
}

async function showAlternatives(span) {
  const rows = await Promise.all(Object.entries(span.alternatives || {}).map(async ([token, lp]) => {
    const id = idOf(token);
    return `<tr${id === Number(span.dataset.tokenId) ? ' class="chosen"' : ""}><td>${escape(JSON.stringify(await textOf(id)))}</td>` +
           `<td class="p">${probability(lp)}</td></tr>`;
  }));
  $("alternatives").innerHTML = `<p>At position ${span.dataset.position}, chose ` +
    `${escape(JSON.stringify(span.textContent))} (p = ${probability(Number(span.dataset.logprob))}):</p>` +
    `<table><tbody>${rows.join("")}</tbody></table>`;
}

function escape(text) {
  return text.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

async function showAttention(span) {
  const position = Number(span.dataset.position);
  document.querySelectorAll(".token.selected").forEach((s) => s.classList.remove("selected"));
  span.classList.add("selected");
  state.selected = span;
  $("attention-controls").hidden = false;
  try {
    const answer = await post("/inspect", { tokens: state.ids.slice(0, position + 1), layer: Number($("layer").value),
                                            head: Number($("head").value) });
    const row = answer.attention[position];
    document.querySelectorAll("#output .token").forEach((s) => {
      const i = Number(s.dataset.position);
      s.style.boxShadow = i <= position ? `inset 0 -0.35em rgba(11, 95, 255, ${Math.sqrt(row[i]).toFixed(3)})` : "";
    });
    $("status").textContent = `attention of position ${position}, layer ${answer.layer}, head ${answer.head}`;
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
}

function options() {
  const body = { model: state.model, max_tokens: Number($("max-tokens").value), temperature: Number($("temperature").value),
                 logprobs: 5, stream: true, return_tokens_as_token_ids: true };
  const topP = Number($("top-p").value);
  if (topP < 1) body.top_p = topP;
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("stop").value !== "") body.stop = [$("stop").value];
  return body;
}

async function generate() {
  if (state.running) return;  // one generation at a time, whatever asks for another (the button, Ctrl+Enter)
  state.running = true;
  const button = $("generate");
  button.disabled = true;
  $("output").replaceChildren();
  $("alternatives").textContent = "Hover or focus a generated token.";
  $("attention-controls").hidden = true;
  state.ids = []; state.texts = [];
  try {
    // The prompt goes as typed, as the API takes it ("" included), and comes back echoed: its tokens
    // with their spans of the text (text_offset), so it shows exactly as typed.
    const prompt = $("prompt").value;
    if (prompt === "") state.ids.push(END_OF_TEXT);  // fed, not shown: /inspect sees what the model saw
    $("status").textContent = "generating";
    const response = await fetch("/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" },
                                                       body: JSON.stringify({ ...options(), prompt, echo: true }) });
    if (!response.ok) throw new Error((await response.json()).error.message);
    let text = [], made = 0, finish = null, buffer = "", echoed = false;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end).replace(/^data: /, "");
        buffer = buffer.slice(end + 2);
        if (event === "[DONE]") continue;
        const chunk = JSON.parse(event);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices[0];
        const before = text.length;
        text = text.concat(Array.from(choice.text));  // characters, as text_offset counts them
        const lp = choice.logprobs;
        const prompt = !echoed;  // the first event is the echoed prompt
        echoed = true;
        lp.tokens.forEach((token, i) => {
          const start = lp.text_offset[i], stop = i + 1 < lp.tokens.length ? lp.text_offset[i + 1] : text.length;
          addToken(idOf(token), text.slice(Math.max(start, before), stop).join(""), lp.token_logprobs[i],
                   lp.top_logprobs[i], prompt);
          made += prompt ? 0 : 1;
        });
        finish = choice.finish_reason || finish;
      }
    }
    $("status").textContent = `done: ${made} tokens (${finish})`;
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  } finally {
    button.disabled = false;
    state.running = false;
  }
}

const shown = [["minigpt:num_requests_running", "", "requests running"],
               ["minigpt:num_requests_waiting", "", "requests waiting"],
               ["minigpt:kv_cache_pages", 'state="in_use"', "KV pages in use"],
               ["minigpt:kv_cache_pages", 'state="cached"', "KV pages cached"],
               ["minigpt:kv_cache_pages", 'state="free"', "KV pages free"],
               ["minigpt:prefix_cache_hits_total", "", "prefix-cache hits (tokens)"],
               ["minigpt:generation_tokens_total", "", "tokens generated"]];
let last = null;

async function poll() {
  try {
    const lines = (await (await fetch("/metrics")).text()).split("\n").filter((l) => l && !l.startsWith("#"));
    const value = (name, label = "") => {  // a sample of `name` ({labels} value) whose labels hold `label`
      const line = lines.find((l) => l.startsWith(name + "{") && l.slice(0, l.indexOf("}")).includes(label));
      return line ? Number(line.slice(line.lastIndexOf(" ") + 1)) : 0;
    };
    const now = performance.now(), tokens = value("minigpt:generation_tokens_total");
    const rate = last && now > last.time ? (tokens - last.tokens) / ((now - last.time) / 1000) : 0;
    last = { time: now, tokens };
    $("stats").innerHTML = shown.map(([name, label, text]) => `<dt>${text}</dt><dd>${value(name, label)}</dd>`).join("") +
                           `<dt>tokens/s</dt><dd>${rate.toFixed(1)}</dd>`;
  } catch (error) {
    $("stats").textContent = "the server does not answer";
  }
}

async function start() {
  state.model = (await (await fetch("/v1/models")).json()).data[0].id;
  $("generate").addEventListener("click", generate);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate(); });
  for (const id of ["layer", "head"]) $(id).addEventListener("change", () => state.selected && showAttention(state.selected));
  poll();
  setInterval(poll, 1000);
}

start();
