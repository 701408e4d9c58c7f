"""``python -m bench [--quick] [--only P1,P3] [--repeats N] [--json FILE]``: run the benchmarks, print one table.

Every row times h3app and its peer in the same process, one after the other, and reports the median of several
runs of each and their ratio, so a busy machine slows both sides alike. Progress goes to stderr; the report
(machine, table) to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CASES: dict[str, str] = {
    "P1": "bench.p1_inspect",
    "P2": "bench.p2_attach",
    "P3": "bench.p3_set_lora",
    "P4": "bench.p4_forward",
    "P5": "bench.p5_merge",
    "P6": "bench.p6_generate",
    "P7": "bench.p7_advanced_strength",
}


def parse_only(text: str | None) -> list[str]:
    """``"P1,p3"`` → ``["P1", "P3"]`` (in table order); None → every case. Unknown names are an error."""
    if text is None:
        return list(CASES)
    wanted = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [name for name in wanted if name not in CASES]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"--only takes a comma-separated list of {', '.join(CASES)}; got {text!r}")
    return [name for name in CASES if name in wanted]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes and fewer repeats: the whole run fits in ~2 minutes on 2 cores")
    parser.add_argument("--only", type=parse_only, default=None, metavar="P1,P3",
                        help=f"run only these cases ({', '.join(CASES)})")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs per measurement (default: 9 full / 5 quick; multi-second steps use fewer)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared machine, a second OpenMP thread that loses its "
                             "core stalls every op at the next barrier; 0 = torch's default, all cores)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None,
                        help="force one clock for every row (default: CPU time for single-threaded compute rows, "
                             "which other processes barely disturb; wall time for I/O and the pipeline rows)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where adapter fixtures are written once and reused (default: $H3APP_BENCH_CACHE or "
                             "~/.cache/h3app-bench)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        build_parser().error("--repeats must be >= 1")
    import torch

    from .adapter_files import default_cache_dir
    from .context import BenchContext
    from .system import system_info
    from .table import render_markdown

    if args.threads < 0:
        build_parser().error("--threads must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.only or list(CASES)
    ctx = BenchContext.create(quick=args.quick, cache_dir=args.cache_dir or default_cache_dir(), repeats=args.repeats,
                              clock=args.clock)
    info = system_info()
    started = time.perf_counter()
    rows = []
    for name in names:
        case_started = time.perf_counter()
        ctx.log(f"{name}: running …")
        rows.extend(importlib.import_module(CASES[name]).run(ctx))
        ctx.log(f"{name}: done in {time.perf_counter() - case_started:.1f} s")
    elapsed = time.perf_counter() - started

    from .system import load_average

    load_end = load_average()
    mode = "quick" if args.quick else "full"
    print(f"## h3app benchmarks ({mode}; cases {', '.join(names)})\n")
    print(info.describe())
    if load_end is not None:
        print(f"Load average at end: {' / '.join(f'{value:.2f}' for value in load_end)}; wall time {elapsed:.0f} s.")
    print("Times are the median of several interleaved runs, or the best of them where 'measured' says so; "
          "ratio = ours / peer (below 1 means h3app is faster); cpu = CPU seconds of this process (robust to other "
          "load), wall = elapsed time.\n")
    print(render_markdown(rows))
    missed = [row for row in rows if row.met is False]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} rows meet their goal"
          + (f"; missed: {', '.join(f'{r.case} ({r.peer})' for r in missed)}." if missed else "."))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"mode": mode, "cases": names, "system": info.to_json(),
                                         "load_average_end": load_end, "seconds": elapsed,
                                         "rows": [row.to_json() for row in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
