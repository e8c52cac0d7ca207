// plotly.js as the plotly package ships it (static/plotly/plotly.min.js, which sets
// window.Plotly), and the one config the control room's charts are drawn with.
import "../plotly/plotly.min.js";

export const Plotly = window.Plotly;

// No mode bar, and the chart follows the size of its box; `extra` adds to it (the
// map's topojsonURL).
export function plotConfig(extra) {
  return {displayModeBar: false, responsive: true, ...extra};
}
