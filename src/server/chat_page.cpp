#include "server/chat_page.h"

namespace ferry::server {

namespace {

constexpr std::string_view kPage = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ferry chat</title>
<style>
  body { margin: 0; font: 15px/1.45 system-ui, sans-serif; background: #f4f5f7; color: #1d2330;
         display: flex; flex-direction: column; height: 100vh; }
  header { padding: 10px 16px; background: #1d2330; color: #fff; display: flex; gap: 12px;
           align-items: center; flex-wrap: wrap; }
  header b { font-size: 17px; }
  header span { opacity: .7; font-size: 13px; }
  header label { font-size: 13px; opacity: .9; }
  header input { width: 64px; }
  header input#key { width: 140px; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { max-width: 760px; margin: 0 auto 12px; padding: 10px 14px; border-radius: 10px;
         white-space: pre-wrap; word-wrap: break-word; }
  .user { background: #dbe7ff; }
  .assistant { background: #fff; border: 1px solid #dde1e8; }
  .error { background: #ffe1e1; }
  .role { font-size: 12px; font-weight: 600; opacity: .6; display: block; margin-bottom: 2px; }
  form { display: flex; gap: 8px; padding: 12px 16px; background: #fff; border-top: 1px solid #dde1e8; }
  textarea { flex: 1; resize: none; height: 44px; font: inherit; padding: 8px; }
  button { padding: 0 18px; font: inherit; }
</style>
</head>
<body data-state="idle">
<header>
  <b>ferry</b><span id="model">…</span>
  <label>system <input id="system" style="width:220px" placeholder="(none)"></label>
  <label>temperature <input id="temperature" type="number" step="0.1" min="0" max="2" value="0.7"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" value="512"></label>
  <label>API key <input id="key" type="password" placeholder="(none)"></label>
  <button id="clear" type="button">new chat</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Send a message (Enter sends, Shift+Enter: new line)"></textarea>
  <button id="send">Send</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const conversation = [];  // {role, content} so far
let busy = false;

$("key").value = localStorage.getItem("ferry_api_key") || "";
$("key").onchange = () => localStorage.setItem("ferry_api_key", $("key").value);

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  div.append(label, body);
  $("log").append(div);
  $("log").scrollTop = $("log").scrollHeight;
  return body;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    $("model").textContent = j.data ? j.data[0].id : (j.error ? j.error.message : "?");
  } catch (e) {
    $("model").textContent = String(e);
  }
}

// Reads an SSE stream of chat.completion.chunk events, calling onText
// with each piece of content. Throws on an error event.
async function readStream(response, onText) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;  // comments and other fields
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        for (const c of j.choices || []) if (c.delta && c.delta.content) onText(c.delta.content);
      }
    }
  }
}

async function send(text) {
  if (busy || !text.trim()) return;
  busy = true;
  document.body.dataset.state = "streaming";
  $("send").disabled = true;
  conversation.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  const messages = [];
  if ($("system").value) messages.push({ role: "system", content: $("system").value });
  messages.push(...conversation);
  let answer = "";
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({
        messages, stream: true,
        temperature: Number($("temperature").value),
        max_tokens: Number($("max_tokens").value),
      }),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : "HTTP " + r.status);
    }
    await readStream(r, (piece) => {
      answer += piece;
      out.textContent = answer;
      $("log").scrollTop = $("log").scrollHeight;
    });
    conversation.push({ role: "assistant", content: answer });
  } catch (e) {
    out.parentElement.className = "msg error";
    out.textContent = answer + (answer ? "\n" : "") + "error: " + e.message;
    conversation.pop();
  }
  busy = false;
  $("send").disabled = false;
  document.body.dataset.state = "done";
}

$("form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("input").value;
  $("input").value = "";
  send(text);
};
$("input").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
};
$("clear").onclick = () => {
  conversation.length = 0;
  $("log").textContent = "";
};

loadModel();
const params = new URLSearchParams(location.search);
if (params.has("max_tokens")) $("max_tokens").value = params.get("max_tokens");
if (params.has("temperature")) $("temperature").value = params.get("temperature");
if (params.has("q")) send(params.get("q"));
</script>
</body>
</html>
)html";

}  // namespace

std::string_view chat_page_html() {
  return kPage;
}

}  // namespace ferry::server
