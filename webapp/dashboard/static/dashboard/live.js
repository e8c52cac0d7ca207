// The live status of one run over /ws/runs/<id>/ (webapp/dashboard/consumers.py).
//
// The page holds syncd's status and its sequence number. A snapshot replaces both; a
// delta applies only on top of the snapshot it names (base) and is dropped when it is
// not newer than what the page holds; a gap (a delta on another base) means messages
// were lost, so the page reconnects and takes a fresh snapshot. Events are numbered by
// id and each is handed on once (the web app and syncd push theirs separately, so ids
// may arrive out of order).
import {socket} from "./common.js";

function applyOps(state, ops) {
  for (const op of ops) {
    const path = op[0];
    let target = state;
    for (const key of path.slice(0, -1)) {
      if (typeof target[key] !== "object" || target[key] === null) target[key] = {};
      target = target[key];
    }
    const last = path[path.length - 1];
    if (op.length === 2) target[last] = op[1]; else delete target[last];
  }
  return state;
}

export class LiveRun {
  // handlers: status(status, seq), events([event]); both optional.
  constructor(runId, handlers) {
    this.seq = -1;
    this.status = null;
    this.seenEvents = new Set();
    this.handlers = handlers;
    // When the latest statuses and events arrived: [seq, Date.now(), status time in s]
    // and [event id, Date.now()]; bench/ui_latency.py reads them.
    this.received = [];
    this.eventsReceived = [];
    this.socket = socket(`/ws/runs/${runId}/`, (m) => this.onMessage(m));
  }

  onMessage(message) {
    if (message.type === "snapshot" || message.type === "status") {
      if (message.type === "status" && message.seq <= this.seq) return;
      this.seq = message.seq;
      this.status = message.status;
      if (message.events) this.onEvents(message.events);
      this.onStatus();
    } else if (message.type === "delta") {
      if (message.seq <= this.seq) return;  // older than the snapshot the page holds
      if (message.base !== this.seq || this.status === null) {
        this.socket.reconnect();  // a delta was missed: start again from a snapshot
        return;
      }
      applyOps(this.status, message.ops);
      this.seq = message.seq;
      this.onStatus();
    } else if (message.type === "events") {
      this.onEvents(message.events);
    }
  }

  onStatus() {
    this.received.push([this.seq, Date.now(), this.status.time]);
    if (this.received.length > 2000) this.received.splice(0, 1000);
    if (this.handlers.status && this.status && this.status.islands) {
      this.handlers.status(this.status, this.seq);
    }
  }

  onEvents(events) {
    const fresh = events.filter((e) => !this.seenEvents.has(e.id));
    if (!fresh.length) return;
    const now = Date.now();
    fresh.forEach((e) => { this.seenEvents.add(e.id); this.eventsReceived.push([e.id, now]); });
    if (this.eventsReceived.length > 2000) this.eventsReceived.splice(0, 1000);
    fresh.sort((a, b) => a.id - b.id);
    if (this.handlers.events) this.handlers.events(fresh);
  }
}
