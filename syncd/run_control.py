"""The run's control flags in Redis: what a user or syncd sets and the run's processes
obey.

The flags a user sets (pause, stop, a checkpoint now, a rejoin), the budget spent
(`done`), elastic whole-job restarts, the tau syncd chose for the islands, and how far
syncd got with the chaos schedule.
A part of syncd.store.RunStore (`store.control`).
"""

from __future__ import annotations

import json

from redis.client import Pipeline

from syncd.run_keys import RunKeys


class RunControl(RunKeys):
    """The control flags of one run, its restarts and its chaos schedule's progress.

    Args: those of syncd.run_keys.RunKeys.
    """

    def mark_done(self) -> None:
        """The budget is spent: islands stop at their next step."""
        self._write(lambda pipe: pipe.set(self.key("done"), 1))

    def done(self) -> bool:
        return bool(self.client.exists(self.key("done")))

    def restart_job(self, until: float) -> int:
        """Elastic: ask every island to roll back and pause until `until`; returns how
        many restarts the run has had, this one included (the field `generation`)."""
        def fill(pipe: Pipeline) -> None:
            pipe.hincrby(self.key("restart"), "generation", 1)
            pipe.hset(self.key("restart"), "until", until)

        return int(self._write(fill)[0])

    def restart(self) -> tuple[int, float]:
        """(restarts so far, the pause's end) of the run's last whole-job restart."""
        raw = self.client.hgetall(self.key("restart"))
        return int(raw.get(b"generation", 0)), float(raw.get(b"until", 0.0))

    def set_tau(self, tau: int) -> None:
        """The run's islands use `tau` from their next send (syncd's choice,
        diloco/overlap.py)."""
        self._write(lambda pipe: pipe.set(self.key("tau"), tau))

    def tau(self) -> int | None:
        """The tau syncd chose for the run's islands; None before it chose, or if the
        key holds no whole number of 0 or more."""
        raw = self.client.get(self.key("tau"))
        try:
            tau = int(raw) if raw is not None else None
        except ValueError:
            return None
        return tau if tau is not None and tau >= 0 else None

    def request_rejoin(self, island: str, at: float) -> None:
        self.client.hset(self.key("rejoin"), island, at)

    def rejoin_requests(self) -> dict[str, float]:
        """Open rejoin requests: island -> when it was asked for."""
        return {k.decode(): float(v) for k, v in self.client.hgetall(self.key("rejoin")).items()}

    def close_rejoin_request(self, island: str) -> None:
        self._write(lambda pipe: pipe.hdel(self.key("rejoin"), island))

    def request_stop(self, at: float) -> None:
        """A user stops the run at `at`: syncd finishes it (syncd/service.py)."""
        self.client.set(self.key("stop"), at, nx=True)

    def stop_requested(self) -> float | None:
        """When a stop was asked for, or None."""
        raw = self.client.get(self.key("stop"))
        return None if raw is None else float(raw)

    def request_checkpoint(self) -> None:
        self.client.set(self.key("checkpoint_now"), 1)

    def take_checkpoint_request(self) -> bool:
        """Whether a checkpoint was asked for since the last call."""
        return bool(self._write(lambda pipe: pipe.delete(self.key("checkpoint_now")))[0])

    def set_paused(self, paused: bool) -> None:
        if paused:
            self.client.set(self.key("paused"), 1)
        else:
            self.client.delete(self.key("paused"))

    def paused(self) -> bool:
        return bool(self.client.exists(self.key("paused")))

    def chaos_progress(self) -> dict[str, str]:
        """How far syncd got with the run's chaos schedule: {start, done, islands}
        (islands as JSON), {} before the schedule's clock started."""
        raw = self.client.hgetall(self.key("chaos"))
        return {k.decode(): v.decode() for k, v in raw.items()}

    def start_chaos(self, start: float, islands: dict[str, str]) -> None:
        """The schedule's clock starts at `start`, over `islands` (name -> region)."""
        self.client.hset(self.key("chaos"), mapping={"start": start, "done": 0,
                                                "islands": json.dumps(islands)})

    def set_chaos_done(self, done: int) -> None:
        """The first `done` actions of the chaos schedule are carried out."""
        self.client.hset(self.key("chaos"), "done", done)
