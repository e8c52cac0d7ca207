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
    arch:R:momentum:<p>            reference to the outer optimizer buffers of fragment p
                                   (arch:R:momentum:<p>:<v>:<t>:<i>)
    arch:R:tokens_merged           hash fragment -> tokens behind its merged updates
    arch:R:handled:<p>             hash island -> newest seq merged or dropped
    arch:R:heartbeats              hash island -> JSON {epoch, time, step, tokens}
                                   (syncd.island_signals)
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

The keys an island process touches (ISLAND_KEYS, and arch:runs, which it only asks
whether its run is in) are all the run's Redis user may touch (syncd/acl.py): not the
secret, the lease's token counter, the status, the commands, the logs, the deaths or any
other run's. An island reads the lease to see syncd change hands (trainer/resend.py);
Redis 6 has no read-only keys, so it could write it too, spoiling only its own run.
"""

from __future__ import annotations

RUNS_KEY = "arch:runs"
# What an island process reads and writes of its run, by the first part after the run's
# prefix; a part that ends in ":*" is a family of keys.
ISLAND_KEYS = ("spec", "epochs", "updates", "uploads", "blob:*", "versions", "full:*", "pub:*",
               "handled:*", "heartbeats", "cursor:*", "fault:*", "done", "stop", "restart",
               "lease")
SYNCD_CONTROL_KEY = "arch:syncd:control"
SYNCD_MEMBERS_KEY = "arch:syncd:members"


def run_prefix(run_id: int | str) -> str:
    """What every key of run `run_id` starts with."""
    return f"arch:{run_id}:"


def island_key_patterns(run_id: int | str) -> list[str]:
    """The key patterns (Redis globs) of run `run_id` that its island processes touch."""
    return [RUNS_KEY, *(run_prefix(run_id) + part for part in ISLAND_KEYS)]


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
