"""python -m syncd: the synchronizer service for its share of the active runs.

It finds active runs in Redis (arch:runs), takes a lease on its share of them
(start several, on one host or many, to split the runs: syncd/lease.py), keeps
one RunSync for each run it holds, and ticks them in turn. It reads REDIS_URL,
DATABASE_URL, CHECKPOINT_DIR, SYNCD_LEASE_TTL_S and SYNCD_THREADS from the environment through
the Django settings, and exits at once with a sentence saying what is wrong when
Redis cannot be reached or wants a password.

`python -m syncd --health` exits 0 when a syncd on this host is serving (its
announcement in Redis is live), 1 otherwise: a container health check.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m syncd",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--health", action="store_true",
                        help="exit 0 if a syncd on this host is serving, 1 if not")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from syncd import lease
    from syncd.server import Syncd, channel_notifier
    from syncd.store import connect
    from webapp.processes import redis_problem

    if problem := redis_problem(settings.REDIS_URL):
        print(f"syncd cannot start: {problem}", file=sys.stderr)
        return 2
    if args.health:
        host = f"{socket.gethostname()}:"
        members = lease.live_members(connect(settings.REDIS_URL))
        return 0 if any(m.startswith(host) for m in members) else 1

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s "
                                                   "%(message)s")
    import torch

    from syncd.malloc import return_large_frees

    torch.set_num_threads(settings.SYNCD_THREADS)
    return_large_frees()
    service = Syncd(settings.REDIS_URL, settings.CHECKPOINT_DIR, channel_notifier(),
                    lease_ttl_s=settings.SYNCD_LEASE_TTL_S)

    def stop(signum: int, frame: object) -> None:
        service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
