"""Time reading a big inline workload: libyaml's loader (`StrictCLoader`) vs pure Python.

    python benchmarks/inline_yaml.py                   # 200,000 inline requests (~12 MB)
    python benchmarks/inline_yaml.py --requests=20000

Issue #20: 200,000 inline requests were still parsing after 120 s with the pure-Python
loader. Both loaders refuse the same things (duplicate keys, tags: tests/scenario/test_strict_yaml.py);
this prints how long each takes to parse the same text, and checks they give the same data.
Such a file is over `sim.scenario.schema.MAX_SCENARIO_BYTES` (4 MiB), so `kvsim run` refuses it and
points to a trace file; the table's "under the cap" row is the largest inline workload a
scenario may hold. Machines are noisy: compare rows of one run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.files.strict_yaml import load_yaml  # noqa: E402
from sim.scenario.schema import MAX_SCENARIO_BYTES  # noqa: E402


def inline_scenario(num_requests: int) -> str:
    """A scenario text with `num_requests` inline requests, one flow mapping per line."""
    lines = [
        "name: inline-big",
        "model: null",
        "scheduler: {design: v1-engine, max_model_len: 4096}",
        "cache: {block_size: 16, num_gpu_blocks: 4096}",
        "step_time: {linear: {fixed_s: 0.01}}",
        "workload:",
        "  kind: inline",
        "  requests:",
    ]
    for i in range(num_requests):
        lines.append(
            f"    - {{arrival_s: {i * 0.01:.2f}, prompt_tokens: {100 + i % 900}, "
            f"output_tokens: {10 + i % 90}}}"
        )
    return "\n".join(lines) + "\n"


def timed(text: str, pure_python: bool) -> tuple[float, object]:
    start = time.perf_counter()
    data = load_yaml(text, pure_python=pure_python)
    return time.perf_counter() - start, data


def main() -> None:
    requests = 200_000
    for arg in sys.argv[1:]:
        if arg.startswith("--requests="):
            requests = int(arg.split("=", 1)[1])
        else:
            raise SystemExit(f"unknown argument {arg!r} (--requests=N)")
    under_cap = MAX_SCENARIO_BYTES // 60  # about 60 bytes a request; then shrunk to fit
    while len(inline_scenario(under_cap).encode()) > MAX_SCENARIO_BYTES:
        under_cap -= 1 + (len(inline_scenario(under_cap)) - MAX_SCENARIO_BYTES) // 70
    print(f"{'requests':>18} {'MB':>6} {'libyaml s':>10} {'python s':>10} {'speed-up':>9}")
    for label, n in ((f"{requests}", requests), (f"{under_cap} (cap)", under_cap)):
        text = inline_scenario(n)
        fast_s, fast = timed(text, pure_python=False)
        pure_s, pure = timed(text, pure_python=True)
        assert fast == pure, "the loaders disagree"
        print(
            f"{label:>18} {len(text) / 1e6:6.1f} {fast_s:10.2f} {pure_s:10.2f} "
            f"{pure_s / fast_s:8.1f}x"
        )


if __name__ == "__main__":
    main()
