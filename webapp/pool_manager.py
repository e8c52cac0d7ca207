"""python -m webapp.pool_manager --region R: a host's pool manager (trainer/pool_manager.py)
with the web app's settings, and its alert for an island that crashed on its own."""

from __future__ import annotations

import argparse
import logging
import os
import signal

from trainer.pool_manager import PoolManager

log = logging.getLogger("archipelago.pool")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", required=True)
    parser.add_argument("--size", type=int, default=None,
                        help="standbys kept ready; default: the ISLAND_POOL_SIZE setting")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from webapp.runs.failures import record_island_failure

    size = settings.ISLAND_POOL_SIZE if args.size is None else args.size
    manager = PoolManager(settings.REDIS_URL, args.region, size, settings.LOG_DIR,
                          on_failure=record_island_failure)

    def stop(signum: int, frame: object) -> None:
        manager.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("pool of %d standby islands for region %s on %s", size, args.region,
             manager.host)
    manager.serve_forever()


if __name__ == "__main__":
    main()
