"""Every Redis key of the runtime, named in one place.

Islands, syncd and the web app talk through these keys and nothing else. Every
value that holds tensors is a signed wire message (diloco.protocol), stored in
chunks (syncd.bulk): the key named below holds a reference {key, chunks, size}
and the bytes lie in `<key>:<i>`. The rest is small JSON.

The chunks (`...:<i>`) and arch:R:dataplane lie on the data plane (a Redis that
keeps nothing on disk, syncd.run_keys), every other key on the control Redis; with
no data plane configured, both are the one Redis.

Keys, for run R (built by syncd.run_keys.RunKeys.key):
    arch:runs                      set of active run ids, for syncd
    arch:R:active                  set while the run is in arch:runs: what its islands
                                   read instead (they may not read arch:runs)
    arch:R:spec                    JSON {mode, config, verify_key, initial_checkpoint}:
                                   what islands read (verify_key: the public half of
                                   the publish key, diloco.signing)
    arch:R:secret                  the run's secret (hex), for syncd and the web app only:
                                   the island keys and the publish key derive from it
    arch:R:epochs                  hash island -> current epoch (older are refused)
    arch:R:updates                 stream of {island, epoch, fragment, seq, chunks, bytes}
                                   (syncd.update_stream)
    arch:R:uploads                 on the data plane: list of tickets
                                   "<epoch>:<fragment>:<seq>:<island>", the queue for
                                   the run's upload slots (syncd.upload_slots)
    arch:R:blob:<island>:<epoch>:<fragment>:<seq>:<i>
                                   chunks of an update message, with a TTL, deleted once
                                   syncd merged, refused or dropped it
    arch:R:versions                hash fragment -> newest global version (syncd.globals_store)
    arch:R:full:<p>                reference to the newest global fragment p (a full
                                   message in arch:R:full:<p>:<v>:<t>:<i>, t the fencing
                                   token of the syncd that wrote it)
    arch:R:pub:<p>:<v>             reference to the published difference v-1 -> v
                                   (arch:R:pub:<p>:<v>:<t>:<i>; lossy downlink; the last
                                   max_staleness are kept)
    arch:R:fencing_tokens          hash fragment -> the fencing token of the grant that
                                   published its newest version
    arch:R:tokens_merged           hash fragment -> tokens behind its merged updates
    arch:R:handled:<p>             hash island -> newest seq merged or dropped
    arch:R:heartbeats              hash island -> JSON of its last Heartbeat, every field
                                   (syncd.records; syncd.island_signals)
    arch:R:deaths                  hash island -> JSON {epoch, time, exit_code, signal}: the
                                   death of an island process, from its supervisor
    arch:R:control:<island>        list of JSON commands for the island's supervisor
    arch:R:log:<island>            the last lines of the island's log, from its supervisor
    arch:R:cursor:<island>         JSON data cursor, so a rejoin goes on in its shard
    arch:R:fault:<island>          JSON {kind, until, factor}: the island's active fault
    arch:R:paused                  set while a user has paused the run (syncd.store)
    arch:R:done                    set when the budget is spent: islands stop
    arch:R:stop                    when a user asked to stop the run: syncd merges what
                                   arrives, checkpoints, and ends the run
    arch:R:restart                 hash {generation, until}: elastic whole-job restarts
    arch:R:tau                     the tau the run's islands use now (0: each waits for
                                   the merge of its update), syncd's choice
                                   (diloco/overlap.py); absent, the config's
    arch:R:rejoin                  hash island -> when a rejoin was asked for
    arch:R:checkpoint_now          set when a user asks for a checkpoint
    arch:R:chaos                   hash {start, done, islands}: how far syncd carried out
                                   the run's chaos schedule
    arch:R:status                  JSON snapshot with its sequence number
    arch:R:status_seq              the snapshots' sequence counter
    arch:R:lease, arch:R:lease_token  which syncd serves the run, its fencing token
                                   (syncd/lease.py)
    arch:R:dataplane               on the data plane: set once syncd published every
                                   fragment there; gone, the data plane lost them
                                   (restarted, flushed) and syncd publishes them again

Keys of syncd processes and of the hosts' pools of warm standby islands:
    arch:syncd:control             list of commands for syncd ("kill")
    arch:syncd:members             sorted set of syncd processes alive (syncd/lease.py)
    arch:pool:<region>:claims      list of JSON claims {run, island, epoch, asked_at,
                                   island_key, redis_password, sig} (signed:
                                   trainer/claims.py; redis_password: the island
                                   user's, syncd/acl.py) for
                                   the region's pool managers, pushed by the run services
                                   (syncd.pool_store)
    arch:pool:<region>:hosts       hash host -> JSON {size, ready, launching, claimed,
                                   standbys, time}: each manager's pool, every half second
    arch:pool:<region>:processing:<host>
                                   list of the claims a manager took and has not handled
                                   yet; handed back to the claims when it goes silent
    arch:R:started:<island>:<epoch>  set by the first pool manager that starts that epoch
                                   of the island (a replayed claim starts nothing)

Who writes and who reads each key of a run is KEY_USES below (docs/RELIABILITY.md
shows it as a table, checked against it by tests/syncd/test_keys.py). The island
users of a run (syncd/acl.py) are derived from it: an island process reaches only the
keys it names for islands, writing only those islands write. Nothing shared between
runs (arch:runs, the pools', syncd's) is among them: an island asks whether its run
is active with arch:R:active, a key of its run's own.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNS_KEY = "arch:runs"
ISLAND = "island"  # the role of a run's island processes in KEY_USES


@dataclass(frozen=True)
class KeyUse:
    """One key (or family of keys: a part that ends in ":*") of a run: on which plane
    it lies and which processes write and read it (web: the run services, the API and
    the pages; syncd; island: the island processes; supervisor: an island's
    supervisor; pool: the pool managers)."""

    part: str
    plane: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]


KEY_USES = (
    KeyUse("spec", "control", ("web",), ("syncd", ISLAND, "supervisor")),
    KeyUse("secret", "control", ("web",), ("syncd",)),
    KeyUse("active", "control", ("web", "syncd"), (ISLAND, "supervisor", "pool")),
    KeyUse("epochs", "control", ("web",), ("syncd", ISLAND, "supervisor", "pool")),
    KeyUse("updates", "control", (ISLAND, "syncd"), ("syncd",)),
    KeyUse("uploads", "data", (ISLAND, "syncd"), (ISLAND, "syncd")),
    KeyUse("blob:*", "data", (ISLAND, "syncd"), ("syncd",)),
    KeyUse("versions", "control", ("syncd",), ("syncd", ISLAND, "web")),
    KeyUse("full:*", "both", ("syncd",), (ISLAND,)),
    KeyUse("pub:*", "both", ("syncd",), (ISLAND,)),
    KeyUse("fencing_tokens", "control", ("syncd",), ("syncd",)),
    KeyUse("tokens_merged", "control", ("syncd",), ("syncd",)),
    KeyUse("handled:*", "control", ("syncd",), (ISLAND, "syncd")),
    KeyUse("heartbeats", "control", (ISLAND,), ("syncd", "web")),
    KeyUse("deaths", "control", ("supervisor",), ("syncd", "web")),
    KeyUse("control:*", "control", ("web", "syncd"), ("supervisor",)),
    KeyUse("log:*", "control", ("supervisor",), ("web",)),
    KeyUse("cursor:*", "control", (ISLAND,), (ISLAND, "supervisor", "web")),
    KeyUse("fault:*", "control", ("web", "syncd", ISLAND), (ISLAND, "syncd")),
    KeyUse("paused", "control", ("web",), ("syncd",)),
    KeyUse("done", "control", ("syncd",), (ISLAND, "syncd")),
    KeyUse("stop", "control", ("web", "supervisor", "pool"), ("syncd", ISLAND, "supervisor")),
    KeyUse("restart", "control", ("syncd",), (ISLAND,)),
    KeyUse("tau", "control", ("syncd",), (ISLAND,)),
    KeyUse("rejoin", "control", ("web", "syncd"), ("syncd",)),
    KeyUse("checkpoint_now", "control", ("web", "syncd"), ("syncd",)),
    KeyUse("chaos", "control", ("syncd",), ("syncd",)),
    KeyUse("status", "control", ("syncd",), ("web",)),
    KeyUse("status_seq", "control", ("syncd",), ("syncd",)),
    KeyUse("lease", "control", ("syncd",), ("syncd", ISLAND)),
    KeyUse("lease_token", "control", ("syncd",), ("syncd",)),
    KeyUse("dataplane", "data", ("syncd",), ("syncd",)),
    KeyUse("started:*", "control", ("pool",), ("pool",)),
    KeyUse("tokenizer", "control", (ISLAND, "syncd"), (ISLAND, "syncd")),
)
# What an island process reads of its run and what it writes, by the part after the
# run's prefix (the island users' key patterns, syncd/acl.py).
ISLAND_READS = tuple(use.part for use in KEY_USES if ISLAND in use.readers)
ISLAND_WRITES = tuple(use.part for use in KEY_USES if ISLAND in use.writers)
SYNCD_CONTROL_KEY = "arch:syncd:control"
SYNCD_MEMBERS_KEY = "arch:syncd:members"


def run_prefix(run_id: int | str) -> str:
    """What every key of run `run_id` starts with."""
    return f"arch:{run_id}:"


def island_key_patterns(run_id: int | str, parts: tuple[str, ...]) -> list[str]:
    """The key patterns (Redis globs) of run `run_id`'s keys `parts` (ISLAND_READS or
    ISLAND_WRITES)."""
    return [run_prefix(run_id) + part for part in parts]


def active_key(run_id: int | str) -> str:
    """The key that is set while run `run_id` is active (in arch:runs)."""
    return run_prefix(run_id) + "active"


def spec_key(run_id: int | str) -> str:
    """The key of a run's spec, which is there from its start until its keys are freed."""
    return run_prefix(run_id) + "spec"


def lease_key(run_id: int | str) -> str:
    """The key of a run's lease: "<token>:<owner>" of the syncd serving it."""
    return run_prefix(run_id) + "lease"


def lease_token_key(run_id: int | str) -> str:
    """The counter that numbers the grants of a run's lease (the fencing tokens)."""
    return run_prefix(run_id) + "lease_token"


def pool_key(region: str, part: str) -> str:
    """A key of a region's pool of warm standbys: "claims" or "hosts"."""
    return f"arch:pool:{region}:{part}"
