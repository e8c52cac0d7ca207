// The colours of the islands' states and faults, the same on the map and the timeline:
// grey for a state without a colour of its own, orange for such a fault.
// waiting and restarting: an elastic island at its barrier or in a whole-job restart.
const STATE_COLOURS = {pending: "#98a2b3", starting: "#f79009", training: "#12b76a",
                       waiting: "#f79009", restarting: "#f79009", lost: "#d92d20",
                       rejoining: "#fdb022", stopped: "#667085", paused: "#7a5af8"};
const FAULT_COLOURS = {straggle: "#0ba5ec", partition: "#7a5af8", degrade: "#ee46bc",
                       corrupt: "#b42318"};

export function stateColour(state) {
  return STATE_COLOURS[state] || "#98a2b3";
}

export function faultColour(fault) {
  return FAULT_COLOURS[fault] || "#f79009";
}
