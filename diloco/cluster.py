"""An in-process cluster: M islands and the synchronizer in one process.

Time is virtual. An island's inner step takes step_time_s / speed seconds and
a message takes latency + bytes * bytes_scale * 8 / bandwidth on its link, so a
run on one machine behaves like islands of unequal hardware on a wide-area
network, while every step is real training. It uses the same Island,
Synchronizer, policy, codecs and wire format as the distributed runtime, and
counts every serialized byte on every island's link in both directions.

Modes:
- decoupled: Decoupled DiLoCo; quorum, grace and weights from the run config.
- sync: plain DiLoCo; every island trains H steps, all of them merge with equal
  weights, and every island takes the result.
- dp: the data-parallel baseline; one model, a global batch made of every
  island's batch, and a ring all-reduce of the fp32 gradient every step.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from diloco import codecs
from diloco.config import IslandConfig, RunConfig
from diloco.data import ShardSampler, run_corpus
from diloco.device import autocast, resolve_device, to_device
from diloco.evaluation import Evaluator
from diloco.fragments import due_fragments, partition
from diloco.island import Island, embedding_tensors, initial_model, inner_lr
from diloco.merge import Update
from diloco.overlap import Overlap, window_seconds
from diloco.policy import RoundStats
from diloco.protocol import decode_message, encode_message
from diloco.signing import island_key, publish_key
from diloco.synchronizer import MergeResult, Published, Synchronizer
from diloco.wan import transfer_time

CLUSTER_MODES = ("decoupled", "sync", "dp")
# Messages are signed here too, so byte counts include the tag and the signature.
SECRET = b"in-process"
UPDATE_KEY = island_key(SECRET, "in-process", 0)  # one process: one key for all islands
PUBLISH_KEY = publish_key(SECRET)


@dataclass
class LocalResult:
    mode: str
    eval_loss: float  # on the validation split
    tokens: int
    tokens_merged: float  # summed over merges, averaged over fragments
    bytes_sent: int
    peak_bytes_per_window: int  # uplink: what streaming fragments spreads out
    peak_down_bytes_per_window: int
    virtual_time_s: float
    outer_steps: int
    merges: int
    rejected: int
    model_params: int
    curve: list[dict] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)


class LinkMeter:
    """Bytes on each island's link, both directions, and the busiest window.

    The peak is per island and direction: the most bytes one link carried one
    way within a window of `window_steps` of that island's inner steps.
    """

    def __init__(self, window_steps: int):
        self.window_steps = max(1, window_steps)
        self.total = 0
        self.windows: dict[tuple[int, str, int], int] = defaultdict(int)

    def add(self, island: int, direction: str, step: int, nbytes: int,
            in_window: bool = True) -> None:
        self.total += nbytes
        if in_window:
            self.windows[(island, direction, max(step - 1, 0) // self.window_steps)] += nbytes

    def peak(self, direction: str) -> int:
        return max((v for (_, d, _), v in self.windows.items() if d == direction), default=0)


def _link_time(island: IslandConfig, nbytes: int, bytes_scale: float) -> float:
    return transfer_time(nbytes, island.bandwidth_gbps, island.latency_ms, bytes_scale)


def round_trip_s(config: RunConfig, up_bytes: int, down_bytes: int) -> float:
    """t_sync of the grace window: the median island's upload of an update plus its
    download of the merged fragment. The round trip, as syncd/rounds.py's round_stats
    passes it (the first sender spent its upload before it arrived, and its overlap of
    tau steps must cover that, the wait and the download); here of the messages' own
    sizes, where syncd, which does not see them, sizes both ways as an fp32 fragment."""
    scale = config.emulation.bytes_scale
    return statistics.median(_link_time(i, up_bytes, scale)
                             + _link_time(i, down_bytes, scale) for i in config.islands)


def run_local(config: RunConfig, mode: str = "decoupled", *, data_dir: Path,
              step_time_s: float = 1.0,
              eval_points: int = 4, window_steps: int | None = None,
              progress: Callable[[dict], None] | None = None) -> LocalResult:
    """Train a run in this process and return its final global model and figures.

    Its evaluations, along the way and at the end, are on the validation split, as a
    real run's are: a benchmark reports the final params on the test split itself.
    The islands (and dp's one model) train on train.device ("auto": cuda when the host
    has a GPU); the synchronizer works on the host, as syncd does.

    Args:
        config: the run config (islands, sync, optim, model, budget...).
        mode: "decoupled", "sync" or "dp".
        data_dir: the data directory the corpus is prepared in (diloco.data.load_corpus).
        step_time_s: virtual seconds of one inner step at speed 1.
        eval_points: evaluations of the global model along the way (the last at the end).
        window_steps: window for peak bytes; default H/P inner steps.
        progress: called with a dict after each evaluation.
    """
    if mode not in CLUSTER_MODES:
        raise ValueError(f"mode must be one of {', '.join(CLUSTER_MODES)}, got {mode!r}")
    if step_time_s <= 0:
        raise ValueError(f"step_time_s must be positive, got {step_time_s}")
    cluster = _Cluster(config, data_dir, step_time_s, eval_points, window_steps, progress)
    return {"decoupled": cluster.run_decoupled, "sync": cluster.run_sync,
            "dp": cluster.run_dp}[mode]()


class _Cluster:
    def __init__(self, config: RunConfig, data_dir: Path, step_time_s: float,
                 eval_points: int, window_steps: int | None,
                 progress: Callable[[dict], None] | None):
        self.config = config
        self.device = resolve_device(config.train.device)
        self.corpus = run_corpus(config.data, data_dir)
        self.init = {k: v.detach().clone() for k, v in initial_model(config).state_dict().items()}
        shapes = {k: v.numel() for k, v in self.init.items()}
        self.fragments = partition(shapes, config.sync.fragments)
        self.step_dur = [step_time_s / i.speed for i in config.islands]
        s = config.sync
        self.meter = LinkMeter(window_steps or max(1, s.inner_steps // s.fragments))
        self.up_bytes = [0] * len(self.fragments)  # the last update's size, per fragment
        self.evaluate = Evaluator(config, self.corpus, "validation", self.device)
        # The last evaluation is at the end of the run, in _result.
        self.milestones = [config.budget.total_tokens * (k + 1) // eval_points
                           for k in range(eval_points - 1)]
        self.curve: list[dict] = []
        self.progress = progress
        self.tokens = 0
        self.tokens_merged = 0.0
        self.merges = 0
        self.rejected = 0
        self.now = 0.0

    # -- shared pieces -------------------------------------------------------

    def _islands(self, config: RunConfig) -> list[Island]:
        return [Island(i, config, self.corpus, self.fragments, self.init, self.device)
                for i in range(len(config.islands))]

    def _maybe_eval(self, params: Callable[[], dict[str, torch.Tensor]], outer_steps: int
                    ) -> None:
        while self.milestones and self.tokens >= self.milestones[0]:
            self.milestones.pop(0)
            point = {"tokens": self.tokens, "time": self.now, "outer_steps": outer_steps,
                     "tokens_merged": self.tokens_merged, "eval_loss": self.evaluate(params())}
            self.curve.append(point)
            if self.progress:
                self.progress(point)

    def _send(self, island: Island, p: int, final: bool = False) -> bytes:
        meta, payload = island.make_update(p, self.config.sync.compression)
        meta.update(run="local", island=island.name, epoch=0, compute_s=0.0,
                    codec=self.config.sync.compression)
        blob = encode_message("update", meta, payload, UPDATE_KEY)
        # The final flush happens once per run; the peak is about steady state.
        self.meter.add(island.index, "up", island.step, len(blob), in_window=not final)
        return blob

    def _receive(self, sync: Synchronizer, blob: bytes, now: float) -> tuple[str, int, str | None]:
        _, meta, tensors = decode_message(blob, UPDATE_KEY)
        p = meta["fragment"]
        self.up_bytes[p] = len(blob)
        delta = codecs.decode(tensors, meta["codec"], sync.shapes[p])
        update = Update(meta["island"], meta["base_version"], meta["tokens"],
                        meta["inner_steps"], delta, meta["seq"])
        reason = sync.submit(update, p, now)
        self.rejected += reason is not None
        return meta["island"], p, reason

    def _pull(self, sync: Synchronizer, island: Island, p: int, now: float) -> float:
        """Mix in the newest global fragment p; returns when the island has it."""
        published = sync.published_since(p, island.state[p].version)
        if not published:
            return now
        nbytes = sum(len(self._global_message(p, one)) for one in published)
        self.meter.add(island.index, "down", island.step, nbytes)
        island.mix_published(p, published, sync.version(p))
        arrival = published[-1].time + _link_time(island.island_config, nbytes,
                                                self.config.emulation.bytes_scale)
        return max(now, arrival)

    def _global_message(self, p: int, published: Published) -> bytes:
        meta = {"run": "local", "fragment": p, "version": published.version,
                "base_version": -1 if published.codec == "none" else published.version - 1,
                "codec": published.codec}
        return encode_message("global", meta, published.payload, PUBLISH_KEY)

    def _account(self, result: MergeResult | None) -> None:
        if result is not None:
            self.merges += 1
            self.tokens_merged += result.tokens / len(self.fragments)

    def _result(self, mode: str, params: dict[str, torch.Tensor], outer_steps: int
                ) -> LocalResult:
        self.milestones = [self.tokens]
        self._maybe_eval(lambda: params, outer_steps)
        return LocalResult(mode, self.curve[-1]["eval_loss"], self.tokens, self.tokens_merged,
                           self.meter.total, self.meter.peak("up"), self.meter.peak("down"),
                           self.now, outer_steps,
                           self.merges, self.rejected, sum(t.numel() for t in params.values()),
                           self.curve, params)

    # -- decoupled -----------------------------------------------------------

    def run_decoupled(self) -> LocalResult:
        config, s = self.config, self.config.sync
        islands = self._islands(config)
        sync = Synchronizer(self.init, self.fragments, s, config.optim, config.round_tokens(),
                            embedding_tensors(config, list(self.init)))
        heap: list = []
        order = itertools.count()

        def push(t: float, kind: str, data: object) -> None:
            heapq.heappush(heap, (t, next(order), kind, data))
        mix_at: list[dict[int, tuple[int, int]]] = [{} for _ in islands]  # as in _step
        waiting: dict[int, int] = {}  # island -> fragment it waits for (tau = 0)
        overlap = Overlap(s.overlap_steps, s.wait_share)  # tau, as syncd/waiting.py's
        last_sync_s, everyone = 0.0, frozenset(i.name for i in islands)

        def try_merge(p: int, now: float) -> None:
            nonlocal last_sync_s
            stats = RoundStats(statistics.median(self.step_dur), last_sync_s,
                               {i.name: d for i, d in zip(islands, self.step_dur, strict=True)})
            decision = sync.decide(p, now, len(islands), stats,  # syncd's tau 0, as Rounds
                                   waiting=everyone if overlap.waits() else None)
            if not decision.merge:
                if decision.deadline is not None and math.isfinite(decision.deadline):
                    push(decision.deadline, "deadline", p)
                return
            before = set(sync.open_round(p))
            result = sync.merge(p, now)
            self._account(result)
            if result is not None:
                newest = sync.published_since(p, sync.version(p) - 1)[-1]
                down = len(self._global_message(p, newest))
                last_sync_s = round_trip_s(config, self.up_bytes[p], down)
            for i, island in enumerate(islands):
                if waiting.get(i) == p and island.name in before:
                    del waiting[i]
                    push(self._pull(sync, island, p, now) + self.step_dur[i], "step", i)

        for i in range(len(islands)):
            push(self.step_dur[i], "step", i)
        while heap:
            self.now, _, kind, data = heapq.heappop(heap)
            if kind == "step" and self.tokens >= config.budget.total_tokens:
                self._send_what_is_left(islands[data], push)
                continue
            if kind == "step":
                self._step(data, islands[data], sync, mix_at[data], waiting, overlap, push)
            elif kind == "arrive":
                name, p, reason = self._receive(sync, data, self.now)
                i = config.island_index(name)
                if reason is not None and waiting.get(i) == p:
                    del waiting[i]
                    push(self._pull(sync, islands[i], p, self.now) + self.step_dur[i], "step", i)
                try_merge(p, self.now)
            else:
                try_merge(data, self.now)
        # The run is over and nobody else will arrive: merge what is still waiting.
        for p in range(len(self.fragments)):
            if sync.open_round(p):
                self._account(sync.merge(p, self.now))
        return self._result("decoupled", sync.global_params(), sync.outer_steps)

    def _send_what_is_left(self, island: Island, push: Callable[[float, str, object], None]
                           ) -> None:
        """The budget is spent: the island sends what it has not sent yet."""
        for p in range(len(self.fragments)):
            if island.state[p].inner_steps:
                blob = self._send(island, p, final=True)
                push(self.now + _link_time(island.island_config, len(blob),
                                           self.config.emulation.bytes_scale), "arrive", blob)

    def _step(self, i: int, island: Island, sync: Synchronizer,
              mix_at: dict[int, tuple[int, int]], waiting: dict[int, int],
              overlap: Overlap, push: Callable[[float, str, object], None]) -> None:
        """Island i's next inner step: it mixes in what is due (`mix_at`: fragment -> (inner
        step to mix at, seq of the send that must be handled first)), sends the fragments
        due (then waits for the merge while the run's `overlap` says tau 0) and steps."""
        s = self.config.sync
        island.inner_step()
        self.tokens += island.tokens_per_step
        ready = self.now
        for p, (step, seq) in list(mix_at.items()):
            if island.step >= step and sync.has_handled(p, island.name, seq):
                del mix_at[p]
                ready = max(ready, self._pull(sync, island, p, self.now))
        for p in due_fragments(island.step, s.inner_steps, s.fragments):
            blob = self._send(island, p)
            scale = self.config.emulation.bytes_scale
            push(ready + _link_time(island.island_config, len(blob), scale), "arrive", blob)
            window_s = window_seconds(s.inner_steps / s.fragments
                                      * statistics.median(self.step_dur))
            tau = overlap.observe(self.now, {"run": (self.now, self.tokens)}, window_s)
            if tau == 0:
                waiting[i] = p
            else:
                # A second send before the mix keeps the first one's target:
                # waiting for the newest send could put off mixing forever.
                mix_at.setdefault(p, (island.step + tau, island.step))
        if i not in waiting:
            push(ready + self.step_dur[i], "step", i)
        self._maybe_eval(sync.global_params, sync.outer_steps)

    # -- plain DiLoCo --------------------------------------------------------

    def run_sync(self) -> LocalResult:
        s = self.config.sync
        config = replace(self.config, sync=replace(s, alpha=0.0, overlap_steps=0,
                                                   weighting="uniform",
                                                   min_quorum=len(self.config.islands),
                                                   max_staleness=0))
        islands = self._islands(config)
        sync = Synchronizer(self.init, self.fragments, config.sync, config.optim,
                            config.round_tokens(), embedding_tensors(config, list(self.init)))
        budget = config.budget.total_tokens
        per_step = sum(island.tokens_per_step for island in islands)
        while self.tokens < budget:
            # Every island trains the same number of steps; the last round is cut
            # short so that the run ends at the token budget like the others.
            steps = min(s.inner_steps, -(-(budget - self.tokens) // per_step))
            for island in islands:
                for _ in range(steps):
                    island.inner_step()
            self.tokens += steps * per_step
            self.now += steps * max(self.step_dur)
            for p in range(len(self.fragments)):
                for island in islands:
                    self._receive(sync, self._send(island, p), self.now)
                self._account(sync.merge(p, self.now))
                self.now = max(self._pull(sync, island, p, self.now) for island in islands)
            self._maybe_eval(sync.global_params, sync.outer_steps)
        return self._result("sync", sync.global_params(), sync.outer_steps)

    # -- data-parallel baseline ----------------------------------------------

    def run_dp(self) -> LocalResult:
        config = self.config
        model = initial_model(config).to(self.device)
        o = config.optim
        optimizer = torch.optim.AdamW(model.parameters(), lr=o.inner_lr, betas=(0.9, 0.95),
                                      weight_decay=o.weight_decay)
        m = len(config.islands)
        samplers = [ShardSampler(self.corpus, i, m, config.model.block_size, config.seed)
                    for i in range(m)]
        n_params = sum(p.numel() for p in model.parameters())
        # A ring all-reduce sends and receives 2(M-1)/M of the fp32 gradient per worker.
        per_direction = 2 * (m - 1) * n_params * 4 // m
        step = 0
        tokens_per_step = sum(i.batch_size for i in config.islands) * config.model.block_size
        while self.tokens < config.budget.total_tokens:
            step += 1
            for group in optimizer.param_groups:
                group["lr"] = inner_lr(step, o.inner_lr, o.warmup_steps)
            batches = [smp.batch(island.batch_size) for smp, island in zip(samplers, config.islands,
                                                                     strict=True)]
            x = to_device(torch.cat([b[0] for b in batches]), self.device)
            y = to_device(torch.cat([b[1] for b in batches]), self.device)
            with autocast(self.device, config.train.precision):
                _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            for i in range(m):
                for direction in ("up", "down"):
                    self.meter.add(i, direction, step, per_direction)
            self.tokens += tokens_per_step
            self.tokens_merged = self.tokens
            self.now += max(self.step_dur)
            self._maybe_eval(lambda: {k: v.detach() for k, v in model.state_dict().items()},
                             step)
        return self._result("dp", {k: v.detach().cpu().clone()
                                   for k, v in model.state_dict().items()}, step)
