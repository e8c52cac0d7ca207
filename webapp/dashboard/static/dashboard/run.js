// The run detail page: everything live from the run's websocket, actions through the
// JSON API. Text from the server is always set as text, never as HTML.
import * as arch from "./common.js";
import {LiveRun} from "./live.js";
import {Plotly, plotConfig} from "./plotting.js";
import {RunMap} from "./run_map.js";
import {RunTimeline} from "./run_timeline.js";

const page = arch.pageData("page-data");
const run = page.run;
// The states, faults and actions as the models name them (webapp/dashboard/views.py).
const vocabulary = page.vocabulary;
const RUN_API = `/api/runs/${run.id}`;
const $ = (id) => document.getElementById(id);
let runState = run.state;
let lastStatus = null;

// -- run state and actions -----------------------------------------------------------

function showRunState(state, reason, startProgress) {
  runState = state;
  $("run-state").textContent = state;
  $("run-state").className = "state " + state;
  showStartProgress(startProgress);
  const allowed = vocabulary.actions[state] || [];
  document.querySelectorAll("#run-actions [data-action]").forEach((b) => {
    b.hidden = !allowed.includes(b.dataset.action);
  });
  if (state === "failed") {
    $("banner-failed").hidden = false;
    if (reason) $("failure-reason").textContent = reason;
  }
}

// A queued run's start goes on on the control worker (202): the page reads the run
// every second while it is queued and says where its start is (start_progress).
let startTimer = null;
let startProgress = "";

function showStartProgress(progress) {
  if (progress !== undefined) startProgress = progress;
  const shown = runState === "queued" && startProgress
    ? vocabulary.start_progress[startProgress] || startProgress : "";
  $("start-progress").textContent = shown;
  if (runState === "queued" && startTimer === null) {
    startTimer = setInterval(readStart, 1000);
  } else if (runState !== "queued" && startTimer !== null) {
    clearInterval(startTimer);
    startTimer = null;
  }
}

async function readStart() {
  let fresh;
  try {
    fresh = await arch.api("GET", RUN_API);
  } catch (e) {
    return;  // read again in a second; the socket's events go on meanwhile
  }
  if (runState === "queued") showRunState(fresh.state, fresh.failure_reason, fresh.start_progress);
}

document.querySelectorAll("#run-actions [data-action]").forEach((button) => {
  button.addEventListener("click", async () => {
    const action = button.dataset.action;
    const result = await arch.act(button, button.textContent, () => arch.api("POST", `${RUN_API}/${action}`));
    if (result && result.state) showRunState(result.state, result.failure_reason, result.start_progress);
  });
});

// -- islands ---------------------------------------------------------------------------

const islandRows = {};
// Columns a narrow screen leaves out (the map and the tooltips have them).
const OPTIONAL_COLUMNS = ["region", "age", "bytes", "rejected"];

function islandRow(name) {
  if (islandRows[name]) return islandRows[name];
  const cells = {};
  const row = arch.el("tr", {"data-island": name});
  for (const key of ["name", "region", "state", "fault", "age", "rate", "step", "lag", "link", "bytes",
                     "weight", "goodput", "rejected"]) {
    const align = ["name", "region", "state", "fault", "link"].includes(key) ? "" : "num";
    cells[key] = arch.el("td", {class: OPTIONAL_COLUMNS.includes(key) ? align + " optional" : align});
    row.appendChild(cells[key]);
  }
  cells.name.textContent = name;
  const actions = arch.el("td", {class: "row-actions"});
  if (page.can.fault) {
    const [kill, ...others] = vocabulary.faults;
    actions.appendChild(arch.el("button", {class: "small danger", "data-fault": kill.kind,
      onclick: (e) => injectFault(e.target, name, kill)}, kill.label));
    const menu = arch.el("details", {class: "menu"}, arch.el("summary", {}, "Faults ▾"));
    menu.appendChild(arch.el("div", {}, ...others.map((fault) => arch.el("button", {
      class: "small quiet", "data-fault": fault.kind, onclick: (e) => {
        menu.open = false;
        injectFault(e.target, name, fault);
      }}, fault.label))));
    actions.appendChild(menu);
    actions.appendChild(arch.el("button", {class: "small", "data-rejoin": "",
      onclick: (e) => arch.act(e.target, `Rejoin ${name}`, () => arch.api("POST", `${RUN_API}/islands/${encodeURIComponent(name)}/rejoin`))}, "Rejoin"));
    cells.warmth = arch.el("small", {class: "muted", "data-rejoin-warmth": ""});
    actions.appendChild(cells.warmth);
  }
  actions.appendChild(arch.el("button", {class: "small quiet", onclick: (e) => showLog(e.target, name)}, "Log"));
  if (page.can.edit) {
    actions.appendChild(arch.el("button", {class: "small quiet", title: `Remove ${name} from the run`,
      "aria-label": `Remove ${name}`, onclick: async (e) => {
        if (!confirm(`Remove island ${name} from the run?`)) return;
        const done = await arch.act(e.target, `Remove ${name}`, () => arch.api("DELETE", `${RUN_API}/islands/${encodeURIComponent(name)}`));
        if (done !== undefined) { row.remove(); delete islandRows[name]; }
      }}, "✕"));
  }
  row.appendChild(actions);
  document.querySelector("#islands tbody").appendChild(row);
  islandRows[name] = {row, cells};
  return islandRows[name];
}

async function injectFault(button, island, fault) {
  const body = {kind: fault.kind};
  if (fault.lasts) {
    const seconds = prompt(`${fault.label} ${island} for how many seconds?`, "20");
    if (seconds === null) return;
    body.duration_s = Number(seconds);
  }
  await arch.act(button, `${fault.label} ${island}`, () => arch.api("POST", `${RUN_API}/islands/${encodeURIComponent(island)}/faults`, body));
}

async function showLog(button, island) {
  const data = await arch.act(button, `Log of ${island}`, () => arch.api("GET", `${RUN_API}/islands/${encodeURIComponent(island)}/log`));
  if (!data) return;
  $("log-island").textContent = island;
  $("log").textContent = (data.lines || []).join("\n") || "(no output yet)";
  $("log-panel").hidden = false;
}
$("log-close").addEventListener("click", () => { $("log-panel").hidden = true; });

function lastWeights(status) {
  const weights = {};
  for (const fragment of status.fragments || []) {
    for (const [island, w] of Object.entries((fragment.last_merge || {}).weights || {})) weights[island] = w;
  }
  return weights;
}

function showIslands(status) {
  const weights = lastWeights(status);
  for (const [name, island] of Object.entries(status.islands)) {
    const {cells} = islandRow(name);
    cells.region.textContent = island.region;
    cells.state.replaceChildren(arch.el("span", {class: "state " + island.state}, island.state));
    const fault = island.fault || "none";
    cells.fault.textContent = fault;
    cells.fault.className = fault === "none" ? "" : "fault";
    cells.age.textContent = island.heartbeat_age_s === null ? "—" : island.heartbeat_age_s.toFixed(1) + " s";
    cells.rate.textContent = arch.fmt(island.tokens_per_s, 0);
    cells.step.textContent = stepAndCpu(island);
    if (cells.warmth) showWarmth(cells.warmth, island);
    const age = island.staleness || {};
    cells.lag.textContent = `${arch.fmt(island.version_lag)} · ${arch.fmt(age.p95, 1)}`;
    cells.lag.title = `ages of its merged updates (versions between its anchor and the merge): last ${arch.fmt(age.last)}, p50 ${arch.fmt(age.p50, 1)}, p95 ${arch.fmt(age.p95, 1)}, max ${arch.fmt(age.max)} over ${arch.fmt(age.count)} merges`;
    showLink(cells.link, island.link);
    cells.bytes.textContent = `${arch.bytes(island.emulated_bytes_up)} / ${arch.bytes(island.emulated_bytes_down)}`;
    cells.bytes.title = `real: ${arch.bytes(island.bytes_up)} sent, ${arch.bytes(island.bytes_down)} received`;
    cells.weight.textContent = name in weights ? weights[name].toFixed(2) : "—";
    cells.goodput.textContent = arch.fmt(island.goodput, 2);
    cells.rejected.textContent = arch.fmt(island.rejections || 0);
  }
}

// Seconds per inner step and the share of the host's CPU: a starved island shows a long
// step and a small share beside its peers.
function stepAndCpu(island) {
  const step = island.step_time_s == null ? "—" : `${island.step_time_s.toFixed(3)} s`;
  const cpu = island.cpu_share == null ? "—" : `${(island.cpu_share * 100).toFixed(1)}%`;
  return `${step} · ${cpu}`;
}

// Whether a rejoin now starts on a warm standby of the island's region (about a
// second) or cold (a new process: imports and the model, many seconds).
function showWarmth(cell, island) {
  if (island.rejoin_warm === undefined) return;
  cell.textContent = island.rejoin_warm ? " warm" : " cold";
  cell.dataset.rejoinWarmth = island.rejoin_warm ? "warm" : "cold";
  cell.title = island.rejoin_warm
    ? `a rejoin now starts on a warm standby of ${island.region}: about a second`
    : `no standby of ${island.region} is ready: a rejoin now starts cold`;
}

function showLink(cell, link) {
  const state = link ? link.state : "down";
  const carried = link ? link.bytes_up + link.bytes_down : 0;
  cell.replaceChildren(arch.el("span", {class: "link " + state, "data-link": state}, state),
    carried ? ` ${arch.bytes(carried)}` : "");
}

// -- regions and the map ---------------------------------------------------------------

function showRegions(status) {
  const byRegion = {};
  for (const [name, island] of Object.entries(status.islands)) {
    (byRegion[island.region] = byRegion[island.region] || []).push([name, island]);
  }
  const list = $("region-list");
  list.replaceChildren();
  for (const [region, islands] of Object.entries(byRegion).sort()) {
    const alive = islands.filter(([, i]) => vocabulary.alive.includes(i.state)).length;
    const line = arch.el("div", {"data-region": region, title: `${alive} of ${islands.length} islands alive`},
      arch.el("span", {}, arch.el("strong", {}, region), ` ${alive}/${islands.length} alive`));
    if (page.can.fault) {
      line.appendChild(arch.el("button", {class: "small danger", onclick: (e) => arch.act(e.target, `Outage of ${region}`,
        () => arch.api("POST", `${RUN_API}/regions/${encodeURIComponent(region)}/faults`, {kind: "outage"}))}, "Outage"));
    }
    list.appendChild(line);
  }
}

const map = new RunMap("map", page.map);
const timeline = new RunTimeline("timeline", run.id);

// -- quorum panel, banner and figures ---------------------------------------------------

// Before syncd serves the run, a row per fragment of its config, so the panel keeps its place.
function showQuorum(status) {
  const body = document.querySelector("#quorum tbody");
  const count = (run.config.sync || {}).fragments || 0;
  const fragments = status.fragments || Array.from({length: count}, (_, p) => ({
    name: `fragment ${p}`, version: "—", arrivals: 0, min_quorum: run.mode === "elastic" ? "—" : run.config.sync.min_quorum,
    grace_left_s: null, waiting: ""}));
  body.replaceChildren(...fragments.map((fragment) => {
    const last = fragment.last_merge || {};
    const weights = Object.entries(last.weights || {}).map(([i, w]) => `${i} ${w.toFixed(2)}`).join(", ");
    return arch.el("tr", {},
      // A line may break after each "+" of a long name (blocks.0+pos_emb+ln_f+lm_head).
      arch.el("td", {}, ...fragment.name.split("+").flatMap((part, i) => (i ? ["+", arch.el("wbr"), part] : [part]))),
      arch.el("td", {class: "num"}, fragment.version),
      arch.el("td", {class: "num"}, `${fragment.arrivals} / ${fragment.min_quorum}`),
      arch.el("td", {class: "num"}, fragment.grace_left_s === null ? "—" : fragment.grace_left_s.toFixed(1) + " s"),
      arch.el("td", {}, fragment.waiting || ""),
      arch.el("td", {}, last.version === undefined ? "—" : `v${last.version}: ${weights}`));
  }));
}

// The corpus' preparation by syncd (syncd/corpus.py): a bar while it is under way, and
// why it failed; hidden once it is ready (or before it begins).
function showCorpus(corpus) {
  const shown = Boolean(corpus) && (corpus.state === "preparing" || corpus.state === "failed");
  $("corpus-figure").hidden = !shown;
  if (!shown) return;
  const share = corpus.bytes_total ? Math.min(1, corpus.bytes_read / corpus.bytes_total) : 0;
  $("corpus-bar").style.width = (100 * share).toFixed(1) + "%";
  $("corpus-text").textContent = corpus.state === "failed" ? `failed: ${corpus.error}`
    : `${corpus.stage || "opening"}: ${arch.fmt(corpus.bytes_read)} of ${arch.fmt(corpus.bytes_total)} bytes, ` +
      `${arch.fmt(corpus.documents)} documents, ${arch.fmt(corpus.skipped)} skipped`;
}

function showFigures(status) {
  $("goodput").textContent = arch.fmt(status.goodput, 3);
  $("uptime").textContent = arch.fmt(status.uptime, 3);
  $("startup").textContent = status.startup_s == null ? "—" : `${arch.fmt(status.startup_s, 1)} s`;
  $("train-loss").textContent = arch.fmt(status.train_loss, 3);
  $("eval-loss").textContent = arch.fmt(status.eval_loss, 3);
  $("eval-loss").title = status.eval_loss == null ? "" : String(status.eval_loss);  // in full
  $("eval-bpb").textContent = arch.fmt(status.eval_bpb, 3);
  $("outer-steps").textContent = arch.fmt(status.outer_steps);
  const slowdown = status.wait_slowdown == null ? ""
    : `; waiting slows the pace ${arch.fmt(100 * status.wait_slowdown, 1)}%`;
  $("tau").textContent = status.tau == null ? "—"
    : `${status.tau}${status.tau === 0 ? ": waits for each merge" : ": overlaps"}${slowdown}`;
  $("versions").textContent = (status.versions || []).join(", ");
  $("islands-alive").textContent = arch.fmt(status.alive_islands);
  const budget = ((run.config.budget || {}).total_tokens) || 0;
  const share = budget ? Math.min(1, status.tokens_merged / budget) : 0;
  $("progress-bar").style.width = (100 * share).toFixed(1) + "%";
  $("progress-text").textContent = `${arch.fmt(status.tokens_merged)} of ${arch.fmt(budget)} tokens`;
  showCorpus(status.corpus);
  const k = run.mode === "elastic" ? 1 : run.config.sync.min_quorum;
  const waiting = $("banner-waiting");
  if ((runState === "running") && status.alive_islands < k) {
    waiting.textContent = `Waiting: ${status.alive_islands} of the ${k} islands a merge needs are alive; ` +
      "the global model does not move until more come back.";
    waiting.hidden = false;
  } else {
    waiting.hidden = true;
  }
}

// -- charts: extended in place, windowed --------------------------------------------------

const charts = {};

function chart(id, title, names) {
  charts[id] = {names: names.slice()};
  Plotly.newPlot(id, names.map((n) => ({x: [], y: [], name: n, mode: "lines", type: "scatter"})),
    {title: {text: title, font: {size: 14}}, margin: {l: 50, r: 10, t: 35, b: 35},
     legend: {orientation: "h", y: -0.2}}, plotConfig());
}

// Add one point per trace; a trace for a name not seen before is added first.
function extend(id, time, values) {
  const c = charts[id];
  for (const name of Object.keys(values)) {
    if (!c.names.includes(name)) {
      c.names.push(name);
      Plotly.addTraces(id, {x: [], y: [], name, mode: "lines", type: "scatter"});
    }
  }
  const idx = [], xs = [], ys = [];
  c.names.forEach((name, i) => {
    if (values[name] === null || values[name] === undefined) return;
    idx.push(i); xs.push([time]); ys.push([values[name]]);
  });
  if (idx.length) Plotly.extendTraces(id, {x: xs, y: ys}, idx, page.chart_points);
}

function islandValues(islands, key) {
  const out = {};
  for (const [name, island] of Object.entries(islands || {})) out[name] = island[key];
  return out;
}

function bytesByLink(islands) {
  const out = {};
  for (const [name, island] of Object.entries(islands || {})) {
    out[`${name} up`] = island.emulated_bytes_up;
    out[`${name} down`] = island.emulated_bytes_down;
  }
  return out;
}

function versionsOf(versions) {
  const out = {};
  (versions || []).forEach((v, p) => { out[`fragment ${p}`] = v; });
  return out;
}

// Held-out loss against merged tokens, a point per evaluation (of the model with
// eval_tokens merged; statuses and history repeat it until the next): beside the
// goodput, it shows whether the tokens merged teach.
let lastEvalTokens = null;

function plotEval(point) {
  if (point.eval_loss == null || point.eval_tokens == null || point.eval_tokens === lastEvalTokens) return;
  lastEvalTokens = point.eval_tokens;
  Plotly.extendTraces("chart-eval", {x: [[point.eval_tokens]], y: [[point.eval_loss]],
    text: [[`${arch.fmt(point.eval_bpb, 3)} bits per byte`]]}, [0], page.chart_points);
}

function plotPoint(time, point) {
  extend("chart-goodput", time, {goodput: point.goodput, uptime: point.uptime});
  plotEval(point);
  extend("chart-loss", time, {train: point.train_loss, eval: point.eval_loss});
  extend("chart-rate", time, islandValues(point.islands, "tokens_per_s"));
  extend("chart-bytes", time, bytesByLink(point.islands));
  extend("chart-versions", time, versionsOf(point.versions));
}

chart("chart-goodput", "Goodput and uptime", ["goodput", "uptime"]);
Plotly.newPlot("chart-eval", [{x: [], y: [], text: [], name: "held-out loss", mode: "lines+markers", type: "scatter"}],
  {title: {text: "Held-out loss against merged tokens", font: {size: 14}}, margin: {l: 50, r: 10, t: 35, b: 35},
   xaxis: {title: {text: "tokens merged"}}, yaxis: {title: {text: "nats per token"}}}, plotConfig());
chart("chart-loss", "Loss", ["train", "eval"]);
chart("chart-rate", "Tokens/s per island", []);
chart("chart-bytes", "Bytes per link (emulated, cumulative)", []);
chart("chart-versions", "Global versions", []);
for (const point of page.metrics) plotPoint(new Date(point.time), point);

// -- events and checkpoints --------------------------------------------------------------

function eventWords(e) {
  const d = e.detail || {};
  const who = e.actor ? ` by ${e.actor}` : "";
  switch (e.kind) {
    case "run_state": return `${d.from} → ${d.to}${d.reason ? ": " + d.reason : ""}${who}`;
    case "merge": return `fragment ${d.fragment} v${d.version} (${Object.keys(d.weights || {}).join(", ")})`;
    case "rejection": return `${e.island}: ${d.reason}`;
    case "fault": return `${d.fault}${e.island ? " on " + e.island : ""}${d.region ? " in " + d.region : ""}${who}`;
    case "alert": return d.message || "";
    default: return `${e.island || ""} ${Object.entries(d).filter(([k]) => k !== "island").map(([k, v]) => `${k} ${JSON.stringify(v)}`).join(", ")}${who}`;
  }
}

function showEvents(events) {
  const list = $("events");
  for (const e of events) {
    const item = arch.el("li", {"data-kind": e.kind},
      arch.el("span", {class: "muted"}, new Date(e.time).toLocaleTimeString() + " "),
      arch.el("span", {class: "kind"}, e.kind), eventWords(e));
    list.insertBefore(item, list.firstChild);
    if (e.kind === "run_state") showRunState(e.detail.to, e.detail.reason);
    if (e.kind === "checkpoint" && !e.detail.requested) loadCheckpoints();
  }
  if (vocabulary.under_way.includes(runState)) timeline.refresh(1000);
  trimEvents(list);
}

// The list keeps its newest EVENTS_KEPT items, the oldest merges going first: a
// fast run merges several times a second, and a fault or a rejoin a minute back
// stays in view however many merges came after it.
const EVENTS_KEPT = 300;
const MERGES_KEPT = 100;

function trimEvents(list) {
  const merges = list.querySelectorAll("li[data-kind='merge']");
  for (let i = merges.length - 1; i >= MERGES_KEPT; i--) merges[i].remove();
  while (list.children.length > EVENTS_KEPT) list.lastChild.remove();
}

function showCheckpoints(checkpoints) {
  const body = document.querySelector("#checkpoints tbody");
  body.replaceChildren(...checkpoints.map((c) => arch.el("tr", {"data-checkpoint": c.id},
    arch.el("td", {class: "num"}, c.outer_step), arch.el("td", {class: "num"}, arch.fmt(c.eval_loss, 3)),
    arch.el("td", {class: "num"}, arch.bytes(c.bytes)), arch.el("td", {}, new Date(c.created_at).toLocaleString()),
    arch.el("td", {class: "actions"},
      arch.el("a", {href: `${RUN_API}/checkpoints/${c.id}/download`}, "Download"),
      arch.el("a", {href: `${RUN_API}/checkpoints/${c.id}/download/hf`, "data-hf": ""}, "HF folder"),
      arch.el("a", {href: `/runs/new/?from=${c.id}`}, "New run from here"),
      arch.el("button", {class: "small quiet", onclick: () => openSample(c)}, "Sample")))));
}

async function loadCheckpoints() {
  try { showCheckpoints((await arch.api("GET", `${RUN_API}/checkpoints`)).checkpoints || []); }
  catch (e) { arch.toast("Checkpoints could not be loaded: " + e.message, true); }
}

let sampleFrom = null;
function openSample(checkpoint) {
  sampleFrom = checkpoint;
  $("sample-checkpoint").textContent = `at outer step ${checkpoint.outer_step}`;
  $("sample-box").hidden = false;
  $("sample-out").textContent = "";
}
$("sample-go").addEventListener("click", async (e) => {
  const prompt = $("sample-prompt").value;
  $("sample-out").textContent = "sampling…";
  const data = await arch.act(e.target, "Sample", () => arch.api("POST",
    `${RUN_API}/checkpoints/${sampleFrom.id}/sample`, {prompt, tokens: 200}));
  $("sample-out").replaceChildren(arch.el("strong", {}, prompt), data ? data.text : "");
});

const addForm = $("add-island");
if (addForm) addForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const f = new FormData(addForm);
  const body = {name: f.get("name"), region: f.get("region"),
                batch_size: Number(f.get("batch_size")), speed: Number(f.get("speed"))};
  const done = await arch.act(addForm.querySelector("button"), `Add ${body.name}`,
    () => arch.api("POST", `${RUN_API}/islands`, body));
  if (done) addForm.reset();
});

// -- wiring --------------------------------------------------------------------------------

// Statuses come twice a second; the page draws the newest once per animation frame, so
// taking a message stays quick however long a draw takes.
let frameAsked = false;

function onStatus(status) {
  lastStatus = status;
  if (frameAsked) return;
  frameAsked = true;
  requestAnimationFrame(() => {
    frameAsked = false;
    showIslands(lastStatus);
    showRegions(lastStatus);
    map.draw(lastStatus.islands);
    if (vocabulary.under_way.includes(runState)) timeline.refresh(3000);
    showQuorum(lastStatus);
    showFigures(lastStatus);
    plotPoint(new Date(lastStatus.time * 1000), lastStatus);
  });
}

showRunState(run.state, run.failure_reason, run.start_progress);
const shownIslands = {};
// The run's islands as the API lists them (webapp/api/schemas.py IslandOut), until syncd's
// status comes.
for (const listed of run.islands) {
  const {cells} = islandRow(listed.name);
  cells.region.textContent = listed.region;
  cells.state.replaceChildren(arch.el("span", {class: "state " + listed.state}, listed.state));
  cells.fault.textContent = listed.fault || "none";
  showLink(cells.link, listed.link);
  shownIslands[listed.name] = {region: listed.region, state: listed.state, fault: listed.fault,
                               link: listed.link};
}
map.draw(shownIslands);
showRegions({islands: shownIslands});
showQuorum({});
timeline.draw(page.timeline);
showEvents(page.events);
showCheckpoints(page.checkpoints);
const live = new LiveRun(run.id, {status: onStatus, events: showEvents});
page.events.forEach((e) => live.seenEvents.add(e.id));
window.archLive = live;  // bench/ui_latency.py reads when the page took each message
