"""python -m syncd: the synchronizer service for its share of the active runs.

It finds active runs in Redis (arch:runs), takes a lease on its share of them
(start several, on one host or many, to split the runs: syncd/lease.py), keeps
one RunSync for each run it holds, and ticks them in turn. The web side plugs in
its records, rejoins and status pushes (webapp/runs/syncd_wiring.py: the one import
upward from syncd, the same as `manage.py syncd`), so it reads REDIS_URL,
DATABASE_URL, CHECKPOINT_DIR, SYNCD_LEASE_TTL_S and SYNCD_THREADS through the
Django settings. It exits at once with a sentence saying what is wrong when Redis
cannot be reached or wants a password.

`python -m syncd --health` exits 0 when a syncd on this host is serving (its
announcement in Redis is live), 1 otherwise: a container health check.
"""

import sys

from webapp.runs.syncd_wiring import main

if __name__ == "__main__":
    sys.exit(main())
