"""python -m syncd: the synchronizer service for every active run.

It finds active runs in Redis (arch:runs), keeps one RunSync for each, and
ticks them in turn. It reads REDIS_URL, DATABASE_URL and CHECKPOINT_DIR from
the environment through the Django settings.
"""

from __future__ import annotations

import logging
import os
import signal


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from syncd.server import Syncd, channel_notifier

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s "
                                                   "%(message)s")
    service = Syncd(settings.REDIS_URL, settings.CHECKPOINT_DIR, channel_notifier())

    def stop(signum: int, frame: object) -> None:
        service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    service.serve_forever()


if __name__ == "__main__":
    main()
