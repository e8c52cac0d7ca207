// Shared by the control room's pages (each imports it as `arch`): the page's data, API
// calls with the CSRF token, toasts, elements, a websocket that reconnects with
// backoff, and numbers as words.

// What the view put in the page as json_script under `id`.
export function pageData(id) {
  return JSON.parse(document.getElementById(id).textContent);
}

function csrf() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

// Every action shows its result or its error: resolves to the JSON body, or throws an
// Error whose message is the API's own sentences.
export async function api(method, path, body) {
  const options = {method, headers: {"X-CSRFToken": csrf(), "Accept": "application/json"},
                   credentials: "same-origin"};
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  const text = await response.text();
  let data = {};
  try { data = text ? JSON.parse(text) : {}; } catch (e) { data = {detail: text}; }
  if (!response.ok) {
    const errors = data.errors || {detail: [data.detail || response.statusText]};
    const words = Object.entries(errors).map(([k, v]) => `${k}: ${[].concat(v).join(" ")}`);
    const error = new Error(words.join("; "));
    error.errors = errors;
    throw error;
  }
  return data;
}

export function toast(message, isError) {
  const box = document.getElementById("toasts");
  const item = document.createElement("div");
  item.className = "toast" + (isError ? " error" : "");
  item.setAttribute("role", isError ? "alert" : "status");
  item.textContent = message;
  box.appendChild(item);
  setTimeout(() => item.remove(), isError ? 12000 : 5000);
}

// Run an action: the button is disabled while it runs ("long actions show progress"),
// then a toast says what happened.
export async function act(button, label, call) {
  const before = button ? button.textContent : "";
  if (button) { button.disabled = true; button.textContent = before + "…"; }
  try {
    const result = await call();
    toast(label + ": done");
    return result;
  } catch (e) {
    toast(label + " failed: " + e.message, true);
    return undefined;
  } finally {
    if (button) { button.disabled = false; button.textContent = before; }
  }
}

export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" || typeof child === "number"
      ? document.createTextNode(String(child)) : child);
  }
  return node;
}

// A websocket that comes back: on close it reconnects after 1, 2, 4 ... 30 s.
export function socket(path, onMessage, onOpen) {
  let delay = 1000;
  let ws = null;
  const connect = () => {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    ws = new WebSocket(scheme + location.host + path);
    ws.onopen = () => { delay = 1000; if (onOpen) onOpen(); };
    ws.onmessage = (e) => onMessage(JSON.parse(e.data), ws);
    ws.onclose = () => { setTimeout(connect, delay); delay = Math.min(delay * 2, 30000); };
  };
  connect();
  return {reconnect: () => ws && ws.close()};
}

export function fmt(value, digits) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "number") return String(value);
  return digits === undefined ? value.toLocaleString() : value.toFixed(digits);
}

export function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KB", "MB", "GB", "TB", "PB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return (n / 10 ** (3 * i)).toFixed(i ? 1 : 0) + " " + units[i];
}
