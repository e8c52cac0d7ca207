"""python -m bench NAME [--quick]: run one benchmark."""

from __future__ import annotations

import argparse

from bench import merge, overhead, quality

BENCHMARKS = {"quality": quality.main, "overhead": overhead.main, "merge": merge.main}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--quick", action="store_true",
                        help="a short run that checks the same relations with looser bounds")
    args = parser.parse_args()
    raise SystemExit(BENCHMARKS[args.name](quick=args.quick))


if __name__ == "__main__":
    main()
