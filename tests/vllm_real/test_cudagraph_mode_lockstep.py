"""Lockstep tier: the `cudagraph_mode` each V1 pin's own config code resolves by default.

`sim.latency.worker_form` form C (and the note in `measured_terms.V1_WORKER_STEP_S`) rests on
it: from `FULL_DECODE_GRAPH_RELEASE` on, a default server replays a decode-only step as one
FULL graph, so per-layer launches are paid only by steps with a prefill chunk. The serving
points measured on 0.8-0.10 servers ran PIECEWISE decode (0.10.1.1 `vllm/config/__init__.py`
L3554-3560), yet kvsim replays them under the 0.11.0 pin; this test pins down which side of
that mismatch each release is on. Each release runs in its own subprocess (one transformers
per process), as tests/vllm_real/test_vllm_defaults_lockstep.py does.
"""

from __future__ import annotations

import pytest

from sim.latency.worker_form import FULL_DECODE_GRAPH_RELEASE
from sim.vllm_real.loader import version_tuple
from tests.harness.repo_process import run_in_repo
from tests.harness.vllm_install import root_or_skip

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("version", ["0.11.0", "0.19.1", "0.33.0"])
def test_a_default_v1_server_replays_decode_as_one_full_graph(version: str) -> None:
    root_or_skip(version)
    assert version_tuple(version)[:2] >= FULL_DECODE_GRAPH_RELEASE
    code = (
        "from sim.vllm_real.defaults_lockstep import real_cudagraph_mode\n"
        f"print('mode', real_cudagraph_mode({version!r}))\n"
    )
    # A fresh interpreter, not tests.harness.zygote: `_RealV1` puts stand-ins for vLLM's
    # compiled modules (`vllm._C`, ...) in sys.modules before its first vLLM import, and the
    # config modules read them at import; a zygote has imported those modules without them.
    proc = run_in_repo("-c", code)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "mode FULL_AND_PIECEWISE" in proc.stdout, out
