// The run page's map: the world's shapes from our own static files (topojsonURL), the
// regions, syncd's place, each island around its region, and each island's WAN link
// to syncd coloured by its state (syncd/status.py link) and as wide as the bytes it
// carried in the last status.
import * as arch from "./common.js";
import {Plotly, plotConfig} from "./plotting.js";
import {stateColour} from "./palette.js";

const LINK_STYLES = {up: ["#12b76a", "solid"], degraded: ["#f79009", "solid"],
                     partitioned: ["#7a5af8", "dash"], down: ["#d92d20", "dot"]};
const FAULT_SYMBOLS = {none: "circle", straggle: "triangle-down", partition: "x",
                       degrade: "diamond", corrupt: "star"};

export class RunMap {
  // map: the page's {regions: {region: [lon, lat]}, syncd, view: {lon, lat}, topojson}.
  constructor(elementId, map) {
    this.id = elementId;
    this.map = map;
    this.drawn = "";
  }

  // islands: name -> {region, state, fault, link: {state, bytes_up, bytes_down}}.
  draw(islands) {
    const entries = Object.entries(islands).sort(([a], [b]) => a.localeCompare(b));
    const carried = (i) => (i.link ? i.link.bytes_up + i.link.bytes_down : 0);
    const most = Math.max(1, ...entries.map(([, i]) => carried(i)));
    const width = (i) => Math.round(2 * (1.5 + 6.5 * Math.sqrt(carried(i) / most))) / 2;
    // Redraw only when something on the map would change.
    const shown = JSON.stringify(entries.map(([n, i]) => [n, i.region, i.state, i.fault,
                                                         i.link && i.link.state, width(i)]));
    if (shown === this.drawn) return;
    this.drawn = shown;
    const places = this.islandPlaces(entries);
    const [syncdLon, syncdLat] = this.map.regions[this.map.syncd] || [0, 0];
    const links = entries.map(([name, island]) => {
      const link = island.link || {state: "down", bytes_up: 0, bytes_down: 0};
      const [colour, dash] = LINK_STYLES[link.state] || LINK_STYLES.down;
      const [lon, lat] = places[name];
      return {type: "scattergeo", mode: "lines", name: `${name} link`, meta: {island: name, state: link.state},
              lon: [lon, syncdLon], lat: [lat, syncdLat], line: {color: colour, width: width(island), dash},
              hoverinfo: "text", showlegend: false,
              text: `${name} ↔ syncd: ${link.state}, ${arch.bytes(link.bytes_up)} up, ` +
                    `${arch.bytes(link.bytes_down)} down in the last status`};
    });
    const markers = {type: "scattergeo", mode: "markers", name: "islands", hoverinfo: "text",
      showlegend: false, lon: [], lat: [], text: [],
      marker: {size: 13, color: [], symbol: [], line: {width: 1, color: "#1d2430"}}};
    for (const [name, island] of entries) {
      const fault = island.fault || "none";
      markers.lon.push(places[name][0]); markers.lat.push(places[name][1]);
      markers.text.push(`${name} (${island.region}): ${island.state}${fault === "none" ? "" : ", " + fault}`);
      markers.marker.color.push(stateColour(island.state));
      markers.marker.symbol.push(FAULT_SYMBOLS[fault] || "circle");
    }
    const regions = Object.keys(this.map.regions).filter((r) => r !== this.map.syncd ||
      entries.some(([, i]) => i.region === r));
    const labels = {type: "scattergeo", mode: "text", hoverinfo: "skip", showlegend: false,
      lon: regions.map((r) => this.map.regions[r][0]), lat: regions.map((r) => this.map.regions[r][1] + this.spread()[1] * 2.2),
      text: regions, textfont: {size: 12, color: "#1d2430"}};
    const syncd = {type: "scattergeo", mode: "markers+text", name: "syncd", hoverinfo: "text",
      showlegend: false, lon: [syncdLon], lat: [syncdLat], text: ["syncd"], textposition: "bottom center",
      hovertext: [`syncd in ${this.map.syncd}`], textfont: {size: 11, color: "#1d2430"},
      marker: {size: 15, symbol: "square", color: "#1d2430", line: {width: 2, color: "#ffffff"}}};
    Plotly.react(this.id, [...links, markers, labels, syncd], {
      margin: {l: 0, r: 0, t: 0, b: 0}, showlegend: false, paper_bgcolor: "rgba(0,0,0,0)",
      geo: {scope: "world", resolution: 110, projection: {type: "equirectangular"},
            lonaxis: {range: this.map.view.lon}, lataxis: {range: this.map.view.lat},
            showland: true, landcolor: "#e9edf2", showocean: true, oceancolor: "#f4f8fc",
            showcountries: true, countrycolor: "#c3cad4", showsubunits: true, subunitcolor: "#d5dbe3",
            coastlinecolor: "#aab4c0", showlakes: false, showframe: false, bgcolor: "rgba(0,0,0,0)"},
    }, plotConfig({topojsonURL: this.map.topojson}));
  }

  // Degrees between islands around their region: a share of the view, so they stay
  // apart at any zoom.
  spread() {
    const v = this.map.view;
    return [(v.lon[1] - v.lon[0]) * 0.022, (v.lat[1] - v.lat[0]) * 0.04];
  }

  islandPlaces(entries) {
    const byRegion = {};
    for (const [name, island] of entries) (byRegion[island.region] = byRegion[island.region] || []).push(name);
    const [dx, dy] = this.spread();
    const places = {};
    for (const [region, names] of Object.entries(byRegion)) {
      const [lon, lat] = this.map.regions[region] || [0, 0];
      names.forEach((name, i) => {
        const angle = Math.PI / 2 + (2 * Math.PI * i) / names.length;
        const r = names.length > 1 ? 1 : 0;
        places[name] = [lon + r * dx * Math.cos(angle), lat + r * dy * Math.sin(angle)];
      });
    }
    return places;
  }
}
