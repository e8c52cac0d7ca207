// The new-run form: a preset reloads the form with its values; island rows are added
// and removed here and renumbered so the server reads them in order.
import * as arch from "./common.js";

document.getElementById("preset").addEventListener("change", (e) => {
  location.search = "?preset=" + encodeURIComponent(e.target.value);
});

const rows = document.getElementById("island-rows");

function renumber() {
  rows.querySelectorAll("tr.island-row").forEach((row, i) => {
    row.querySelectorAll("[name]").forEach((input) => {
      input.name = input.name.replace(/^islands-\d+-/, `islands-${i}-`);
    });
  });
}

function wire(row) {
  row.querySelector("[data-remove-island]").addEventListener("click", () => {
    if (rows.querySelectorAll("tr.island-row").length > 1) { row.remove(); renumber(); }
  });
}

rows.querySelectorAll("tr.island-row").forEach(wire);

document.getElementById("add-island").addEventListener("click", () => {
  const last = rows.querySelector("tr.island-row:last-child");
  const row = last.cloneNode(true);
  row.querySelectorAll(".errorlist").forEach((e) => e.remove());
  const names = new Set([...rows.querySelectorAll("input[name$='-name']")].map((i) => i.value));
  let n = names.size;
  while (names.has(`island-${n}`)) n += 1;
  row.querySelector("input[name$='-name']").value = `island-${n}`;
  rows.appendChild(row);
  wire(row);
  renumber();
});

// Sizes: after a change, the values the estimate depends on go to POST
// /api/config/estimate (missing ones take their defaults) and its answer is shown.
const form = document.getElementById("run-form");
const estimate = document.getElementById("estimate");
const SIZED_SECTIONS = ["model", "sync", "optim", "train", "emulation"];
const TEXT_KEYS = ["name", "region"];

function typed(key, text) {
  return TEXT_KEYS.includes(key) || text === "" || isNaN(Number(text)) ? text : Number(text);
}

function sizedConfig() {
  const config = {islands: []};
  for (const input of form.elements) {
    if (!input.name) continue;  // fieldsets and buttons
    const island = input.name.match(/^islands-(\d+)-(\w+)$/);
    const [section, key] = input.name.split(".");
    const value = input.type === "checkbox" ? input.checked : typed(island ? island[2] : key,
                                                                     input.value.trim());
    if (value === "") continue;
    if (island) {
      (config.islands[Number(island[1])] ||= {})[island[2]] = value;
    } else if (key && SIZED_SECTIONS.includes(section)) {
      (config[section] ||= {})[key] = value;
    }
  }
  return config;
}

function shown(bytes) {
  if (bytes >= 2 ** 30) return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  if (bytes >= 2 ** 20) return `${(bytes / 2 ** 20).toFixed(0)} MiB`;
  return `${(bytes / 2 ** 10).toFixed(0)} KiB`;
}

// Three significant digits: 48.1, 0.543, 0.0403; whole numbers from 1000 up.
function three(x) {
  return x >= 1000 ? Math.round(x).toLocaleString() : String(Number(x.toPrecision(3)));
}

function showWire(wire) {
  const body = document.querySelector("#estimate-wire tbody");
  body.replaceChildren(...Object.entries(wire).map(([name, w]) => {
    const row = document.createElement("tr");
    for (const text of [name, three(w.up_bytes / 1e6), three(w.down_bytes / 1e6),
                        three(w.up_s), three(w.down_s)]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    return row;
  }));
}

function figure(list, label, text, parts) {
  const term = document.createElement("dt");
  term.textContent = label;
  const value = document.createElement("dd");
  value.textContent = text;
  if (parts) {
    value.title = Object.entries(parts).filter(([, b]) => b > 0)
      .map(([name, b]) => `${name}: ${shown(b)}`).join("\n");
  }
  list.append(term, value);
}

// What the config's K, grace, alpha and tau cost in speed and quality, with the figures'
// sources (diloco/tradeoffs.py).
function showTradeoffs(tradeoffs) {
  const list = document.getElementById("estimate-tradeoffs");
  list.replaceChildren(...(tradeoffs || []).map((t) => {
    const item = document.createElement("li");
    const name = document.createElement("strong");
    name.textContent = `${t.setting} = ${t.value}`;
    const source = document.createElement("small");
    source.className = "muted";
    source.textContent = ` (${t.source})`;
    item.append(name, `. Speed: ${t.speed}. Quality: ${t.quality}.`, source);
    return item;
  }));
}

function showEstimate(data) {
  const list = document.getElementById("estimate-figures");
  list.replaceChildren();
  figure(list, "parameters", `${data.params.toLocaleString()} (${shown(data.model_bytes)} in float32)`);
  const taken = (nbytes) => nbytes ? `, ${shown(nbytes)} taken by other runs` : "";
  figure(list, "Redis", `${shown(data.redis.total)} of ${shown(data.limits.redis_bytes)} ` +
         `(REDIS_MAXMEMORY_MB)${taken(data.taken.redis_bytes)}`, data.redis.parts);
  figure(list, "syncd", `${shown(data.syncd.total)} of ` +
         `${shown(data.limits.syncd_host_bytes)} (SYNCD_HOST_MEMORY_MB)` +
         taken(data.taken.syncd_bytes), data.syncd.parts);
  for (const [name, need] of Object.entries(data.islands)) {
    // The peak is what admission holds to the host; the expected, what it typically holds.
    figure(list, `island ${name}`, `${shown(need.total)} peak ` +
           `(${shown(data.expected[name].total)} expected) of ` +
           `${shown(data.limits.island_host_bytes)} (ISLAND_HOST_MEMORY_MB)`, need.parts);
  }
  for (const [region, nbytes] of Object.entries(data.taken.island_host_bytes)) {
    figure(list, `island host ${region}`, `${shown(nbytes)} taken by other runs`);
  }
  showWire(data.wire);
  showTradeoffs(data.tradeoffs);
  const misfits = document.getElementById("estimate-misfits");
  misfits.replaceChildren(...Object.entries(data.misfits).flatMap(([key, messages]) =>
    messages.map((message) => {
      const item = document.createElement("li");
      item.textContent = `${key}: ${message}`;
      return item;
    })));
}

let asked = 0;
let timer;

async function refreshEstimate() {
  const mine = ++asked;
  try {
    const data = await arch.api("POST", estimate.dataset.url, {config: sizedConfig()});
    if (mine === asked) showEstimate(data);
  } catch (e) {
    if (mine !== asked) return;
    document.getElementById("estimate-figures").replaceChildren();
    showWire({});
    showTradeoffs([]);
    const item = document.createElement("li");
    item.textContent = `No estimate until the config is valid: ${e.message}`;
    document.getElementById("estimate-misfits").replaceChildren(item);
  }
}

function estimateSoon() {
  clearTimeout(timer);
  timer = setTimeout(refreshEstimate, 300);
}

form.addEventListener("input", estimateSoon);
form.addEventListener("change", estimateSoon);
form.addEventListener("click", (e) => {
  if (e.target.closest("[data-remove-island], #add-island")) estimateSoon();
});
refreshEstimate();
