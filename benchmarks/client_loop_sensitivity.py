"""How far a per-chunk cost on the benchmark client's own loop would move kvsim's accuracy.

    python benchmarks/client_loop_sensitivity.py                 # the pre-registered grid
    python benchmarks/client_loop_sensitivity.py --chunk-us 25   # one value
    python benchmarks/client_loop_sensitivity.py --ids a,b       # some points only

A sensitivity analysis, not a fit (`sim.vllm_bench.client_loop`, PRE-REGISTERED: no sourced
value of the vLLM client's per-message cost exists, so none is chosen and the shipped client
stays free). Every point of `serving_accuracy.py` is replayed once per grid value of
`ClientLoop.chunk_s` (0, 10, 25, 50, 100 us), and the script prints, per value, the median
|error| per metric group on all points, the fit half and the held-out half, and the median
over independent sources; then the points whose error changes most at the largest value. The
grid is fixed before any run; nothing here is read back into kvsim. About 100 s a value on 2
shared cores (the replays dominate; the client loop is a post-process).
"""

from __future__ import annotations

import argparse
import sys

from serving_accuracy import GROUPS, Replay, load_points, replay, select, sources_summary, summary

from sim.vllm_bench.client_loop import ClientLoop

#: The pre-registered grid (microseconds per SSE message; module docstring of
#: `sim.vllm_bench.client_loop`).
GRID_US = (0.0, 10.0, 25.0, 50.0, 100.0)


def moved(base: list[Replay], other: list[Replay], top: int) -> list[str]:
    """The `top` point-groups whose |error| moves most from `base` to `other`."""
    changes = []
    for a, b in zip(base, other, strict=True):
        for group in GROUPS:
            fa, fb = a.group(group), b.group(group)
            if fa is None or fb is None:
                continue
            changes.append((abs(fb[1].error) - abs(fa[1].error), a.point.id, a.point.split,
                            group, fa[1].error, fb[1].error))  # fmt: skip
    changes.sort(key=lambda c: -abs(c[0]))
    lines = ["| id | split | group | error at 0 | error here | change of abs error |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for change, pid, split, group, e0, e1 in changes[:top]:
        lines.append(f"| {pid} | {split} | {group} | {e0:+.1%} | {e1:+.1%} | {change:+.1%} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-us", type=float, action="append", default=None,
                        help="a value of ClientLoop.chunk_s in us (repeatable); default: the grid")  # fmt: skip
    parser.add_argument("--ids", default=None, help="comma-separated point ids")
    parser.add_argument("--top", type=int, default=10, help="points listed as moving most")
    args = parser.parse_args(argv)
    values = tuple(args.chunk_us) if args.chunk_us else GRID_US
    points = select(load_points(), args.ids, None)
    base = [replay(p) for p in points]
    for value in values:
        done = base if value == 0 else [replay(p, client_loop=ClientLoop(value * 1e-6)) for p in points]  # fmt: skip
        print(f"\n## chunk_s = {value:g} us\n")
        print(summary(done))
        print()
        print(sources_summary(done))
        if value != 0:
            print()
            print("\n".join(moved(base, done, args.top)))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
