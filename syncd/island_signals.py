"""The islands' signals: heartbeats, deaths, logs, commands, data cursors and faults.

What an island, its supervisor and the control room tell each other about one
island, beside the data plane.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from typing import Any

import redis

from syncd.records import Heartbeat, HeartbeatError
from syncd.run_keys import RunKeys

log = logging.getLogger("archipelago.syncd")

LOG_TTL_S = 7 * 24 * 3600
MAX_SIGNAL_BYTES = 64 * 1024  # a heartbeat or fault longer than this is not one


class IslandSignals(RunKeys):
    """A run's per-island keys other than its updates."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.refused: dict[str, str] = {}  # island -> why its last heartbeat read is not one

    def heartbeat(self, island: str, beat: Heartbeat) -> None:
        key, value = self.key("heartbeats"), json.dumps(dataclasses.asdict(beat))
        self.own_write(self.writer, key, lambda: self.writer.hset(key, island, value))

    def heartbeats(self) -> dict[str, Heartbeat]:
        """island -> its last heartbeat. One that is not a heartbeat (islands write this
        hash, so it is read as hostile: not JSON, not an object of at most
        MAX_SIGNAL_BYTES, a field missing, unknown or of the wrong type or bounds:
        Heartbeat.from_dict) is left out, as if the island had sent none, and logged
        once until the island's heartbeat is another."""
        try:
            raw = self.client.hgetall(self.key("heartbeats"))
        except redis.ResponseError as exc:
            self.wrong_type(self.client, self.key("heartbeats"), exc)
            return {}
        beats, refused = {}, {}
        for key, value in raw.items():
            island = key.decode(errors="replace")
            try:
                beats[island] = _heartbeat(value)
            except HeartbeatError as exc:
                refused[island] = str(exc)
                if self.refused.get(island) != refused[island]:
                    log.warning("run %s: island %s's heartbeat is not one (left out): %s",
                                self.run_id, island[:64], exc)
        self.refused = refused
        return beats

    def report_death(self, island: str, epoch: int, exit_code: int | None,
                     at: float | None = None) -> None:
        """The island's process of `epoch` is dead (from its supervisor, which saw it
        end): syncd marks the island lost at once instead of after its heartbeat
        timeout. `exit_code` is the process's: negative for the signal that killed it."""
        death = {"epoch": epoch, "time": time.time() if at is None else at,
                 "exit_code": exit_code,
                 "signal": -exit_code if exit_code is not None and exit_code < 0 else None}
        self.client.hset(self.key("deaths"), island, json.dumps(death))

    def deaths(self) -> dict[str, dict[str, Any]]:
        """island -> the last death its supervisor reported."""
        raw = self.client.hgetall(self.key("deaths"))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def epochs_and_deaths(self) -> tuple[dict[str, int], dict[str, dict[str, Any]]]:
        """`epochs()` and `deaths()` in one round trip (syncd reads both every pass)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.key("epochs"))
        pipe.hgetall(self.key("deaths"))
        epochs, deaths = pipe.execute()
        return ({k.decode(): int(v) for k, v in epochs.items()},
                {k.decode(): json.loads(v) for k, v in deaths.items()})

    def put_log(self, island: str, lines: list[str]) -> None:
        """The last lines of an island's log, so the control room shows them whatever
        host the island runs on."""
        self.client.set(self.key("log", island), json.dumps(lines), ex=LOG_TTL_S)

    def log(self, island: str) -> list[str] | None:
        raw = self.client.get(self.key("log", island))
        return json.loads(raw) if raw else None

    def send_command(self, island: str, kind: str, **args: Any) -> None:
        self.client.rpush(self.key("control", island), json.dumps({"kind": kind, **args}))

    def next_command(self, island: str) -> dict[str, Any] | None:
        raw = self.client.lpop(self.key("control", island))
        return json.loads(raw) if raw else None

    def save_cursor(self, island: str, cursor: dict[str, Any]) -> None:
        self.writer.set(self.key("cursor", island), json.dumps(cursor))

    def cursor(self, island: str) -> dict[str, Any] | None:
        """The island's data cursor; None if it has none, or what an island wrote there is
        not one (not a JSON object of at most MAX_SIGNAL_BYTES, or not a string)."""
        try:
            raw = self.client.get(self.key("cursor", island))
        except redis.ResponseError as exc:
            self.wrong_type(self.client, self.key("cursor", island), exc)
            return None
        return _json_object(raw) if raw else None

    def fault(self, island: str) -> dict[str, Any]:
        """The island's active fault ({kind, until, factor}), or {} if none."""
        try:
            raw = self.client.get(self.key("fault", island))
        except redis.ResponseError:  # another type: no fault (syncd's next one replaces it)
            return {}
        fault = (_json_object(raw) if raw else None) or {}
        return fault if _number(fault.get("until", 0)) > time.time() else {}

    def clear_fault(self, island: str) -> None:
        self.writer.delete(self.key("fault", island))

    def faults(self, islands: list[str]) -> dict[str, str]:
        """island -> kind of its active fault (straggle, partition, degrade, corrupt)."""
        if not islands:
            return {}
        values = self.client.mget([self.key("fault", i) for i in islands])
        now = time.time()
        active = {i: _json_object(v) for i, v in zip(islands, values, strict=True) if v}
        return {i: str(f["kind"]) for i, f in active.items()
                if f is not None and "kind" in f and _number(f.get("until", 0)) > now}

    def set_fault(self, island: str, kind: str, until: float, factor: float,
                  seconds: float) -> None:
        """The island's active fault, which it reads and acts out until `until`. The key
        outlives the fault a little, so the island reads its end from "until" rather
        than from the key vanishing mid-read; then Redis forgets it."""
        self.client.set(self.key("fault", island),
                   json.dumps({"kind": kind, "until": until, "factor": factor}),
                   ex=math.ceil(seconds) + 60)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """`raw` as a JSON object of at most MAX_SIGNAL_BYTES, None if it is not one."""
    if len(raw) > MAX_SIGNAL_BYTES:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    return value if isinstance(value, dict) else None


def _number(value: object) -> float:
    """A finite number, or -inf for anything else."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else -math.inf


def _heartbeat(raw: bytes) -> Heartbeat:
    """The heartbeat `raw` holds, or HeartbeatError."""
    beat = _json_object(raw)
    if beat is None:
        raise HeartbeatError(f"not a JSON object of at most {MAX_SIGNAL_BYTES} bytes")
    return Heartbeat.from_dict(beat)
