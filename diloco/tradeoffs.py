"""What K, grace, alpha, tau and the merge timing cost in quality and in speed, with the
figures measured so far and where each comes from: the config's help texts
(diloco/config.py) say it in short, the estimate (POST /api/config/estimate, the
new-run page's Sizes) for the config's own values. A setting no benchmark has
measured says so; no figure here is made up, and each names its results file or
journal entry.

The figures of `bench convergence --quick` (bench/results/convergence-quick.json) are one
run on 2 shared cores at a load average of 2.7 (decoupled's loss at equal tokens moves
by about 2% from run to run, sync's by 0.2%: docs/journal/benchmarks-2026.md gives the
means of several): they are indicative. Those of the full profile
(240 s a run on an idle machine, steps about eight times longer: tau 1 fixed at
65a78cb in the journal, tau chosen by the pace in bench/results/convergence.json) say
what tau and alpha cost where the round trip is short against a step. Those of
`bench convergence --in-process` (bench/results/convergence-inprocess.json) are on a
virtual clock, which the load does not move.
"""

from __future__ import annotations

CONVERGENCE = ("bench/results/convergence-quick.json: python -m bench convergence --quick, "
               "commit f47e1dc, 4 islands of a 2-layer 64-wide byte GPT, H = 20, 60 s each, "
               "2 cores at load 2.7 (one run, indicative)")
FULL = ("docs/journal/benchmarks-2026.md (2026-12-07, evening): python -m bench "
        "convergence at 65a78cb, tau 1 fixed, 4 islands of a 4-layer 128-wide byte GPT, "
        "batch 8 x 128, H = 20, 240 s each, an idle machine; tau 0 and alpha 0.5 beside mode "
        "sync")
WAIT = ("bench/results/convergence.json: python -m bench convergence, commit 8ef9654, the "
        "same workload with tau chosen by the run's pace (sync.wait_share 0.35); single "
        "runs in docs/journal/benchmarks-2026.md (2026-12-08)")
INPROCESS = ("bench/results/convergence-inprocess.json: python -m bench convergence "
             "--in-process, the same workload in the in-process cluster on a virtual clock, "
             "islands out of phase (speeds 0.50 to 0.38), 275,456 tokens, seeds 1234 and 7")
SIMULATE = ("docs/journal/benchmarks-2026.md, bench simulate: 8 islands, 1.2M chips, "
            "'Archipelago's own choices'")
NOT_MEASURED = "no benchmark has measured it yet"

# setting -> (speed, quality): what the help text says, with its figure.
COSTS = {
    "min_quorum": (
        "a lower K merges as soon as K islands sent, without waiting for the slowest: "
        "K = 2 of 4 merged 2.05x the tokens of mode sync (K = 4, every island waits) "
        "in 60 s",
        "with sync.merge_each_period (the default) a round still waits for the islands "
        "due within its period, so K below M holds about as many updates per merge: at "
        "K = 2 of 4 held-out loss was 0.944x sync's at equal time and 1.007x at equal "
        "tokens in that run (about 1.03x at 1M tokens, the mean of five), with 0.955 "
        "merges per H window against 1.026 and update age p95 1 against 0; at merging "
        "on quorum it was 1.039x, 2.044 merges per H window (see merge_each_period), "
        "and what is left is tau's (see it)"),
    "grace_gamma": (
        "the window after quorum is sized to close before the senders need the result "
        "(tau steps less the round trip): gamma 1 kept goodput at 89.4%, as gamma 0, in "
        "the simulator; sized by the download alone it cost 6.7 points (82.7%)",
        "it lets islands that arrive within the window into the merge (more updates per "
        "merge, fewer stale ones); " + NOT_MEASURED),
    "alpha": (
        "none: the mix is one lerp per fragment",
        "alpha > 0 keeps that share of the island's own fragment at each mix, so the "
        "islands drift apart between merges: at the full profile alpha 0.5 read 1.822 at "
        "240 s against mode sync's 1.737 beside it (1.049x; alpha 0 1.033x), and 1.917 at "
        "3.5M tokens against alpha 0's 1.853; other values " + NOT_MEASURED),
    "overlap_steps": (
        "tau >= 1: an island trains on while its update travels and merges, never waiting "
        "for the round trip; tau = 0 waits each period. That pays where the round trip is "
        "long against a step: at the quick profile's 30 ms steps mode sync (K = M, tau 0) "
        "merged 0.49x the tokens of the defaults in 60 s, and tau 0 with K = 2 of 4 1.3M "
        "and 2.6M tokens where tau 1 merged 4.1M to 4.8M. Where it is short it buys "
        "nothing: at the full profile's steps of about 0.25 s the defaults merged "
        "3,880,960 tokens in 240 s, mode sync 3,858,432 and tau 0 3,823,616",
        "an island mixes the global fragment in no sooner than tau steps after its send, "
        "and in the real system a round trip after it (latency each way, the download's "
        "poll, syncd's pass), its own steps since the send kept on top of a global that "
        "lacks them. At the full profile that cost the defaults 1.040x mode sync's loss "
        "at equal tokens, with K = M as much, where tau 0 with K = 2 of 4 read 0.990x at "
        "equal tokens and 0.995x at equal time; at the quick profile tau 0 read 2.121 and "
        "2.132 at 1M tokens against 2.225 for tau 1 (the mean of five) and 2.164 for mode "
        "sync (four; docs/journal/benchmarks-2026.md, 2026-12-07)"),
    "wait_share": (
        "with tau >= 1 syncd measures the run's pace (tokens trained per second) with "
        "the islands waiting for each merge and overlapping, and they wait only while "
        "that slows it by at most this share: where islands share cores one's wait is "
        "another's compute (at the full profile, 4 islands on 2 cores, the rule merged "
        "5,068,800 tokens in 240 s against mode sync's 4,904,960), and where the turnaround "
        "is long against the training it overlaps it overlaps (at the quick profile's 30 ms "
        "steps waiting slowed the pace 83% to 149%)",
        "waiting makes each merge synchronous DiLoCo's: tau 0 with K = 2 of 4 read 0.990x "
        "mode sync's loss at equal tokens where tau 1 read 1.040x; late in a run at the "
        "full profile mode sync took 0.92M tokens for the drop of loss that overlapping "
        "took 1.26M for (an overlapped token taught 0.73 of a waiting one), hence the "
        "default 0.35; in the full profile the defaults waited 195 s of 240 and read "
        "1.047x mode sync's loss at 240 s and 1.046x at equal tokens (their last minute "
        "merged in two groups of 2 islands a few fragments apart), K = M 1.003x; a single "
        "run of the same code 1.014x at 240 s and 1.009x at equal tokens"),
    "merge_each_period": (
        "islands with tau >= 1 train on while a round waits for the islands expected "
        "within its period, at the same pace as without (241,152 tokens at 268.4 virtual "
        "s either way); only a run's last merges wait for them after the budget is "
        "spent (371.9 s against 310.2 s to the end)",
        "the islands that arrive within a period land in one merge instead of K merging "
        "at once and the rest spilling a version stale into a second: 1.190 merges per H "
        "window against 2.156 off, held-out loss 0.974x off's at equal tokens (1.008x "
        "mode sync's, off: 1.035x) and 0.994x off's at equal time; islands at nearly "
        "one pace 1.000x mode sync's"),
}
SOURCES = {"min_quorum": CONVERGENCE, "grace_gamma": SIMULATE, "alpha": FULL,
           "overlap_steps": FULL, "wait_share": WAIT, "merge_each_period": INPROCESS}


def help_text(setting: str) -> str:
    """The cost of a sync setting, for its help text: speed, then quality."""
    speed, quality = COSTS[setting]
    return f"Speed: {speed}. Quality: {quality} ({SOURCES[setting].split(':')[0]})."


def tradeoffs(min_quorum: int, islands: int, grace_gamma: float, alpha: float,
              overlap_steps: int, wait_share: float,
              merge_each_period: bool) -> list[dict[str, str]]:
    """What the config's K, grace, alpha, tau, wait share and merge timing cost: per
    setting its value as set, its speed and quality costs and the source of their
    figures."""
    values = {
        "min_quorum": f"{min_quorum} of {islands} islands" + (
            ": every merge waits for the slowest island" if min_quorum >= islands else ""),
        "grace_gamma": f"{grace_gamma:g}" + (": no window, a merge at quorum"
                                             if grace_gamma == 0 else ""),
        "alpha": f"{alpha:g}" + (": the global replaces the island's fragment"
                                 if alpha == 0 else ""),
        "overlap_steps": f"{overlap_steps}" + (": each island waits for each merge"
                                               if overlap_steps == 0 else ""),
        "wait_share": f"{wait_share:g}" + (
            ": islands never wait" if wait_share == 0 and overlap_steps else
            ": tau is 0, islands always wait" if overlap_steps == 0 else
            ": waits while that slows the run's pace by at most that share"),
        "merge_each_period": ("true: a round merges once per period" if merge_each_period
                              else "false: a round merges at quorum and grace"),
    }
    return [{"setting": f"sync.{name}", "value": values[name], "speed": COSTS[name][0],
             "quality": COSTS[name][1], "source": SOURCES[name]} for name in COSTS]
