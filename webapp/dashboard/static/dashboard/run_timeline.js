// The run page's timeline: a lane per island, time across. States as wide bars,
// active faults as a thin bar above them, faults, rejoins and merges as marks below.
// The lanes come from GET /api/runs/<id>/timeline (webapp/runs/timeline.py).
import * as arch from "./common.js";
import {faultColour, stateColour} from "./palette.js";
import {Plotly, plotConfig} from "./plotting.js";

const MARK_STYLES = {fault: {symbol: "x-thin-open", color: "#b42318", size: 9},
                     rejoin: {symbol: "triangle-up", color: "#1f6feb", size: 8},
                     merge: {symbol: "line-ns-open", color: "#98a2b3", size: 6}};
const RECOVERY_STEPS = [["fault", null], ["lost", "lost"], ["rejoin", "rejoin"],
                        ["first_step", "first step"], ["first_merge", "first merge"]];

function recoveryWords(recovery) {
  const s = recovery.seconds;
  const steps = RECOVERY_STEPS.filter(([key]) => s[key] !== null && s[key] !== undefined)
    .map(([key, label]) => (label === null ? recovery.fault : `${label} ${s[key].toFixed(1)} s`));
  const pending = RECOVERY_STEPS.filter(([key, label]) => label && s[key] === null).map(([, l]) => l);
  let words = steps.join(" → ");
  if (pending.length) words += `<br>not yet: ${pending.join(", ")}`;
  const phases = Object.entries(recovery.phases || {});
  if (phases.length) words += "<br>rejoin: " + phases.map(([k, v]) => `${k} ${Number(v).toFixed(1)} s`).join(", ");
  return words;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString();
}

export class RunTimeline {
  constructor(elementId, runId) {
    this.id = elementId;
    this.path = `/api/runs/${runId}/timeline`;
    this.loading = false;
    this.loadedAt = 0;
  }

  // Fetch the lanes again, at most every `every` ms and one fetch at a time.
  refresh(every) {
    if (this.loading || Date.now() - this.loadedAt < every) return;
    this.loading = true;
    this.loadedAt = Date.now();
    arch.api("GET", this.path).then((t) => this.draw(t))
      .catch((e) => arch.toast("The timeline could not be loaded: " + e.message, true))
      .finally(() => { this.loading = false; });
  }

  draw(timeline) {
    const lanes = timeline.islands;
    const traces = [];
    const bars = {};  // trace key -> bar trace
    const bar = (key, name, colour, offset, width) => {
      if (!bars[key]) {
        bars[key] = {type: "bar", orientation: "h", name, base: [], x: [], y: [], hovertext: [],
                     hoverinfo: "text", width, offset, marker: {color: colour}, showlegend: false};
        traces.push(bars[key]);
      }
      return bars[key];
    };
    lanes.forEach((lane, y) => {
      for (const span of lane.spans) {
        const t = bar("state " + span.state, span.state, stateColour(span.state), -0.3, 0.44);
        t.base.push(span.start * 1000); t.x.push((span.end - span.start) * 1000); t.y.push(y);
        let words = `${lane.island}: ${span.state} from ${clock(span.start)} for ${(span.end - span.start).toFixed(1)} s`;
        if (span.recovery) words += "<br>" + recoveryWords(span.recovery);
        t.hovertext.push(words);
      }
      for (const fault of lane.faults) {
        const t = bar("fault " + fault.fault, fault.fault, faultColour(fault.fault), -0.45, 0.12);
        t.base.push(fault.start * 1000); t.x.push((fault.end - fault.start) * 1000); t.y.push(y);
        t.hovertext.push(`${lane.island}: ${fault.fault} from ${clock(fault.start)} for ${(fault.end - fault.start).toFixed(1)} s`);
      }
    });
    for (const [kind, style] of Object.entries(MARK_STYLES)) {
      const marks = {type: "scatter", mode: "markers", name: kind, x: [], y: [], hovertext: [],
                     hoverinfo: "text", marker: {...style, line: {width: 1.5, color: style.color}}, showlegend: false};
      lanes.forEach((lane, y) => {
        for (const mark of lane.marks.filter((m) => m.kind === kind)) {
          marks.x.push(mark.time * 1000); marks.y.push(y + 0.32);
          marks.hovertext.push(`${lane.island}: ${mark.label} at ${clock(mark.time)}`);
        }
      });
      traces.push(marks);
    }
    this.showLegend(Object.values(bars));
    Plotly.react(this.id, traces, {
      height: 46 + 34 * Math.max(lanes.length, 1), barmode: "overlay", bargap: 0,
      margin: {l: 90, r: 10, t: 6, b: 28}, hovermode: "closest", showlegend: false,
      xaxis: {type: "date", range: [timeline.start * 1000, timeline.end * 1000]},
      yaxis: {tickvals: lanes.map((_, y) => y), ticktext: lanes.map((l) => l.island), range: [lanes.length - 0.5, -0.5],
              zeroline: false, fixedrange: true},
    }, plotConfig());
  }

  // What each colour and mark means, for the states and faults on the lanes.
  showLegend(bars) {
    const legend = document.getElementById(this.id + "-legend");
    legend.replaceChildren(...bars.map((t) => arch.el("span", {},
      arch.el("i", {class: "swatch block", style: `background: ${t.marker.color}`}), t.name)),
      arch.el("span", {}, "marks: × fault, ▲ rejoin, | merge that took the island's update"));
  }
}
