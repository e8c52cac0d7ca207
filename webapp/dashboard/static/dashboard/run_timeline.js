// The run page's timeline: a lane per island, time across. States as wide bars,
// active faults as a thin bar above them, faults, rejoins and merges as marks below.
// The lanes come from GET /api/runs/<id>/timeline (webapp/runs/timeline.py): the page
// holds them from its start, then asks only for what is new (`since`) and appends it.
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

// The lanes' spans before `since` (those that cross it cut there) and the fresh ones
// from it on; a span cut at `since` and a fresh one that goes on from there in the same
// state (or fault) are one span, with the fresh one's recovery.
function joinSpans(kept, fresh, since, key) {
  const spans = kept.filter((s) => s.start < since).map((s) => ({...s, end: Math.min(s.end, since)}));
  const rest = [...fresh];
  const last = spans[spans.length - 1];
  if (last && rest.length && last.end === rest[0].start && last[key] === rest[0][key]
      && Boolean(last.recovery) === Boolean(rest[0].recovery)) {
    spans[spans.length - 1] = {...rest.shift(), start: last.start};
  }
  return spans.concat(rest);
}

function joinLanes(lanes, fresh) {
  const since = fresh.since;
  const had = Object.fromEntries(lanes.islands.map((lane) => [lane.island, lane]));
  const islands = fresh.islands.map((lane) => {
    const old = had[lane.island] || {spans: [], faults: [], marks: []};
    return {island: lane.island, spans: joinSpans(old.spans, lane.spans, since, "state"),
            faults: joinSpans(old.faults, lane.faults, since, "fault"),
            marks: old.marks.filter((m) => m.time < since).concat(lane.marks)};
  });
  return {start: Math.min(lanes.start, fresh.start), end: fresh.end, islands};
}

// Where the next fetch starts: a little before the end of what the page has (an event
// is stamped by its writer's clock and may be stored a moment after its time), or
// the start of a lane's latest outage that is over but whose recovery still waits
// for its first step or merge, so that those arrive on its spans.
const OVERLAP_S = 30;

function nextSince(timeline) {
  let since = timeline.end - OVERLAP_S;
  for (const lane of timeline.islands) {
    let i = lane.spans.findLastIndex((s) => s.recovery);
    if (i < 0 || i === lane.spans.length - 1) continue;
    const seconds = lane.spans[i].recovery.seconds;
    if (seconds.first_step !== null && seconds.first_merge !== null) continue;
    while (i > 0 && lane.spans[i - 1].recovery) i -= 1;
    since = Math.min(since, lane.spans[i].start);
  }
  return since;
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
    this.timeline = null;
  }

  // Fetch what is new on the lanes, at most every `every` ms and one fetch at a time.
  refresh(every) {
    if (this.loading || Date.now() - this.loadedAt < every) return;
    this.loading = true;
    this.loadedAt = Date.now();
    const path = this.timeline ? `${this.path}?since=${nextSince(this.timeline)}` : this.path;
    arch.api("GET", path)
      .then((t) => this.draw(this.timeline && t.since !== null ? joinLanes(this.timeline, t) : t))
      .catch((e) => arch.toast("The timeline could not be loaded: " + e.message, true))
      .finally(() => { this.loading = false; });
  }

  draw(timeline) {
    this.timeline = timeline;
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
