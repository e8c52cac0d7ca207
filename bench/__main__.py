"""python -m bench NAME [--quick] [--minutes N] [--device D] [--preset P] [--in-process]
[--modes M,..] [--cases C,..]:
run one benchmark.

python -m bench docs: write docs/BENCHMARKS.md from the committed results (bench/docs.py).
A benchmark waits for one running on the same machine to end (bench/exclusive.py)."""

from __future__ import annotations

import argparse
import shlex
import sys

from bench import (
    convergence,
    convergence_inprocess,
    dataplane,
    docs,
    efficiency,
    exclusive,
    goodput,
    gpu_smoke,
    merge,
    models,
    overhead,
    quality,
    rejoin,
    scale,
    signing,
    simulate,
    soak,
    ui_latency,
    utilization,
    wan,
)

BENCHMARKS = {"quality": quality.main, "overhead": overhead.main, "merge": merge.main,
              "goodput": goodput.main, "simulate": simulate.main, "ui_latency": ui_latency.main,
              "soak": soak.main, "gpu_smoke": gpu_smoke.main, "scale": scale.main,
              "rejoin": rejoin.main, "efficiency": efficiency.main,
              "dataplane": dataplane.main, "utilization": utilization.main,
              "signing": signing.main, "convergence": convergence.main, "wan": wan.main,
              "models": models.main}
TIMED = ("soak", "scale")  # the benchmarks that take --minutes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=[*sorted(BENCHMARKS), "docs"])
    parser.add_argument("--quick", action="store_true",
                        help="a short run that checks the same relations with looser bounds")
    parser.add_argument("--minutes", type=float, default=None,
                        help="soak: how long the chaos lasts (default 10, 1 with --quick); "
                             "scale: train the top size this long instead of every size")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"),
                        help="scale only: where the islands train (default cpu)")
    parser.add_argument("--preset", default=None,
                        help="quality: check this preset's codecs at its own size "
                             "(e.g. gpt2_small) instead of the profiles' small models; "
                             "rejoin: time a warm rejoin of this preset's run at its size; "
                             "dataplane: this preset's model alone (e.g. llama_114m)")
    parser.add_argument("--modes", default=None,
                        help="convergence only: the modes to run, comma-separated (of "
                             f"{', '.join(convergence.MODES)}; default: the profile's)")
    parser.add_argument("--cases", default=None,
                        help="convergence only: the cases to run, comma-separated (of "
                             f"{', '.join(convergence.CASES)}; default: the profile's)")
    parser.add_argument("--in-process", action="store_true",
                        help="convergence only: the merge timing variants in the in-process "
                             "cluster, on a virtual clock (bench/convergence_inprocess.py)")
    args = parser.parse_args()
    if args.name == "docs":
        raise SystemExit(docs.main())
    options: dict[str, object] = {"quick": args.quick}
    if args.minutes is not None:
        if args.name not in TIMED:
            parser.error(f"--minutes is an option of {' and '.join(TIMED)} alone")
        if not args.minutes > 0:
            parser.error(f"--minutes must be above 0, got {args.minutes:g}")
        options["minutes"] = args.minutes
    if args.device is not None:
        if args.name != "scale":
            parser.error("--device is an option of scale alone")
        options["device"] = args.device
    if args.preset is not None:
        if args.name not in ("quality", "rejoin", "dataplane"):
            parser.error("--preset is an option of quality, rejoin and dataplane alone")
        options["preset"] = args.preset
    for option in ("modes", "cases"):
        chosen = getattr(args, option)
        if chosen is not None:
            if args.name != "convergence" or args.in_process:
                parser.error(f"--{option} is an option of convergence alone")
            names = tuple(n for n in chosen.split(",") if n)
            known = convergence.MODES if option == "modes" else convergence.CASES
            if not names or [n for n in names if n not in known]:
                parser.error(f"--{option} takes names of {', '.join(known)}, got {chosen!r}")
            options[option] = names
    if args.in_process:
        if args.name != "convergence":
            parser.error("--in-process is an option of convergence alone")
        run = convergence_inprocess.main
    else:
        run = BENCHMARKS[args.name]
    with exclusive.alone(shlex.join(sys.argv[1:])):
        raise SystemExit(run(**options))


if __name__ == "__main__":
    main()
