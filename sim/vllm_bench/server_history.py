"""A benchmark run on a server that earlier runs left warm: their prompts in its prefix cache.

`vllm bench serve` runs are often made one after another against one `vllm serve` process
(a sweep over `--num-prompts`, say). With the same dataset options and seed, the random
dataset draws the same prompts in the same order whatever `--num-prompts` is, so prompt i of a
later run is token for token prompt i of every earlier one, and the server's prefix cache (on
by default in V1) still holds the blocks of the prompts the earlier runs left unevicted:

- `RandomDataset.get_sampling_params` (0.11.0 `vllm/benchmarks/datasets.py` L512-521) draws
  the input lengths, the output lengths and then the offsets from one `default_rng(seed)`;
  with `--random-range-ratio 0` the lengths are constant and `Generator.integers` draws no
  bits for a one-value range, so the offsets come straight from the seed, element by element:
  the first k offsets are the same for any `num_prompts >= k`;
- `generate_token_sequence` (L523-559) makes prompt i of `(offset_i + i + arange(input_len))
  % vocab_size`: the index and the offset only.

Each run also sends its ready-check test request first (prompt 0; `with_test_run`). kvsim
replays the earlier runs on the same engine before the measured one: every run's prompt i gets
the content key `UNIQUE_KEY_BASE + i` (after the shared special-token/prefix segment), runs
are `RUN_GAP_S` apart (the server idles between them, as between real runs; nothing in the
engine depends on the idle time), and the result holds the measured run's requests only.

Example: runs of 10 then 1 prompts, 1,024-token prompts, block 16: the second run's test
request and its one prompt are prompt 0, cached by the first run: 1,008 hit tokens each (the
last partial block is never cached; V1 recomputes at least the last token).

What this leaves out: runs with other dataset options on the same server (their prompts would
share tokens only partly), and requests other clients sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sim.kv.types import Segment
from sim.workload.request import UNIQUE_KEY_BASE, RequestSpec

#: Seconds between the starts of consecutive runs (and between a run's test request and its
#: benchmark): longer than any run; the engine is idle across it.
RUN_GAP_S = 1.0e6


def dataset_content(spec: RequestSpec, index: int) -> RequestSpec:
    """`spec` with its whole prompt spelt out as content: its shared segments, then the rest
    keyed by its dataset `index` (not its request id), so prompt i is the same tokens in
    every run."""
    shared = sum(seg.num_tokens for seg in spec.prefix)
    rest = spec.prompt_tokens - shared
    prefix = spec.prefix + ((Segment(UNIQUE_KEY_BASE + index, rest),) if rest > 0 else ())
    return replace(spec, prefix=prefix)


def lay_out_runs(
    runs: Sequence[Sequence[RequestSpec]], test_run: bool
) -> tuple[list[RequestSpec], int, float]:
    """The runs, oldest first and the measured one last, as one request list on one clock:
    run k starts at k x `RUN_GAP_S` (its test request, prompt 0, when `test_run`; its
    benchmark `RUN_GAP_S / 2` later). Returns the list, the measured run's first request id
    and its benchmark's start.

    Example: runs of 2 and 1 prompts with the test run: ids 0 (test), 1, 2 from 0 and 5e5 s,
    then 3 (test), 4 from 1e6 and 1.5e6 s; the measured run starts at id 4, 1.5e6 s."""
    out: list[RequestSpec] = []
    first_id, start_s = 0, 0.0
    for k, run in enumerate(runs):
        run_start_s = k * RUN_GAP_S
        if test_run and run:
            out.append(
                replace(dataset_content(run[0], 0), request_id=len(out), arrival_s=run_start_s)
            )
        start_s = run_start_s + (RUN_GAP_S / 2 if test_run else 0.0)
        first_id = len(out)
        for i, spec in enumerate(run):
            out.append(replace(dataset_content(spec, i), request_id=len(out),
                               arrival_s=start_s + spec.arrival_s))  # fmt: skip
    return out, first_id, start_s
