// Overlay runs: loss against tokens and against time since each run's start, goodput
// over time; e.g. decoupled against elastic on the same faults.
import * as arch from "./common.js";
import {Plotly, plotConfig} from "./plotting.js";

const series = arch.pageData("series-data");
const layout = (title, x, y) => ({title: {text: title, font: {size: 14}}, margin: {l: 50, r: 10, t: 35, b: 40},
  xaxis: {title: {text: x}}, yaxis: {title: {text: y}}, legend: {orientation: "h", y: -0.25}});

function traces(xOf, yKey) {
  return series.map((s) => {
    const start = s.metrics.length ? new Date(s.metrics[0].time) : new Date();
    const points = s.metrics.filter((m) => m[yKey] !== null);
    return {x: points.map((m) => xOf(m, start)), y: points.map((m) => m[yKey]),
            name: `${s.name} (${s.mode})`, mode: "lines", type: "scatter"};
  });
}
const byTokens = (m) => m.tokens;
const bySeconds = (m, start) => (new Date(m.time) - start) / 1000;
Plotly.newPlot("loss-tokens", traces(byTokens, "train_loss"), layout("Train loss against tokens", "tokens", "loss"), plotConfig());
Plotly.newPlot("loss-time", traces(bySeconds, "train_loss"), layout("Train loss against time", "seconds since start", "loss"), plotConfig());
Plotly.newPlot("goodput-time", traces(bySeconds, "goodput"), layout("Goodput over time", "seconds since start", "goodput"), plotConfig());
Plotly.newPlot("eval-tokens", traces(byTokens, "eval_loss"), layout("Eval loss against tokens", "tokens", "loss"), plotConfig());
