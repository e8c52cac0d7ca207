// A simulation's progress and results, live over /ws/simulations/<id>/.
import * as arch from "./common.js";
import {Plotly, plotConfig} from "./plotting.js";

const initial = arch.pageData("simulation-data");
const $ = (id) => document.getElementById(id);
const layout = (title, x, y, logX) => ({title: {text: title, font: {size: 14}},
  margin: {l: 50, r: 10, t: 35, b: 40}, legend: {orientation: "h", y: -0.3},
  xaxis: {title: {text: x}, type: logX ? "log" : "linear"}, yaxis: {title: {text: y}, range: [0, 1.02]}});

function show(sim) {
  $("sim-state").textContent = sim.state;
  $("sim-state").className = "state " + sim.state;
  $("sim-progress").style.width = (100 * sim.progress).toFixed(0) + "%";
  $("sim-words").textContent = sim.state === "completed" ? "Done." :
    `${(100 * sim.progress).toFixed(0)}% of the sweep's runs done.`;
  if (sim.error) { $("sim-error").hidden = false; $("sim-error").textContent = sim.error; }
  if (sim.result) draw(sim.result);
}

function draw(result) {
  const series = {};
  for (const r of result.goodput_table) {
    const label = r.mode === "decoupled" ? `decoupled M=${r.islands}` : r.mode;
    (series[label] = series[label] || []).push(r);
  }
  Plotly.react("sim-goodput", Object.entries(series).map(([name, rows]) => ({
    x: rows.map((r) => r.chips), y: rows.map((r) => r.goodput), name, mode: "lines+markers"})),
  layout("Goodput against chips", "chips", "goodput", true), plotConfig());
  Plotly.react("sim-knobs", [{type: "bar", x: result.knobs_table.map((r) => r.knob),
    y: result.knobs_table.map((r) => r.goodput)}], layout("One knob at a time", "", "goodput"), plotConfig());
  const modes = [...new Set(result.bandwidth_table.map((r) => r.mode))];
  Plotly.react("sim-bandwidth", modes.map((m) => {
    const rows = result.bandwidth_table.filter((r) => r.mode === m);
    return {x: rows.map((r) => r.bandwidth_gbps), y: rows.map((r) => r.utilization), name: m, mode: "lines+markers"};
  }), layout("12B model, 4 regions: utilization", "Gb/s", "utilization", true), plotConfig());
  document.querySelector("#sim-table tbody").replaceChildren(...result.goodput_table.map((r) =>
    arch.el("tr", {}, arch.el("td", {}, r.mode), arch.el("td", {class: "num"}, r.islands),
      arch.el("td", {class: "num"}, arch.fmt(r.chips)), arch.el("td", {class: "num"}, arch.fmt(r.goodput, 3)),
      arch.el("td", {class: "num"}, arch.fmt(r.uptime, 3)))));
}

show(initial);
if (initial.state === "queued" || initial.state === "running") {
  arch.socket(`/ws/simulations/${initial.id}/`, (message) => show(message.simulation));
}
