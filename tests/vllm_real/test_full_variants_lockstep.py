"""Lockstep tier for full attention's variants (issue #23 part 1,
`sim.kv.v1_engine.full_variants`): kvsim's sink, R-SWA and circular-buffer managers under the
hybrid coordinator against the real manager of each release that has them (sink: 0.19.1,
0.20.0; R-SWA: 0.25.1, 0.26.0, 0.33.0; circular buffer: 0.33.0), mutations the comparison
must catch, and the releases whose own sink manager cannot be built.

Each check runs in a subprocess (the releases' dependencies differ), through the
chunked-local tier's helper. Skipped when an install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

pytestmark = pytest.mark.vllm

#: Per release, the layout words of the types it has (`lockstep._full_variant_layout_name`).
TYPES = {
    "0.19.1": ("sink",),
    "0.20.0": ("sink",),
    "0.25.1": ("R-SWA",),
    "0.26.0": ("R-SWA",),
    "0.33.0": ("R-SWA", "circular buffer"),
}


def _python(version: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter on the Python sources (a mutation patches a class)."""
    return run_python(version, script, *args, sources=True)


_VERIFY = """
import sys
from sim.kv.v1_engine import full_variants as fv
from sim.kv.v1_engine.single_type import FullAttentionManager
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
if mutation == "sink-unreserved":  # the sink blocks left in the free queue
    fv.SinkFullAttentionManager.reserve_sink_blocks = lambda self: None
elif mutation == "rswa-no-gap":  # R-SWA freeing nothing, as full attention
    fv.RSWAManager.remove_skipped_blocks = lambda self, r, c, p=None: None
elif mutation == "rswa-gap-floor":  # the gap from floor(P / bs): a partial prompt block freed
    gap = fv.RSWAManager._gap
    fv.RSWAManager._gap = lambda self, c, p: (p // self.block_size, gap(self, c, p)[1])
elif mutation == "ring-grows":  # the ring grown like a full-attention table
    for name in ("get_num_blocks_to_allocate", "allocate_new_blocks"):
        setattr(fv.CircularBufferManager, name, getattr(FullAttentionManager, name))
elif mutation in ("variant-no-hit", "ring-in-hit"):  # a wrong hit rule (`variant_caching`)
    from sim.kv.v1_engine import hybrid_coordinator as hc
    split = hc.split_variant_groups
    def wrong(groups):
        full, other, uncached = split(groups)
        if mutation == "ring-in-hit":  # the ring looked up as a full group: never cached
            return sorted(full + uncached), other, []
        # sink / R-SWA groups left out of the hit, as a ring
        variants = [i for i in full if groups[i].is_full_variant]
        return [i for i in full if i not in variants], other, sorted(uncached + variants)
    hc.split_variant_groups = wrong
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
"""


def _ops_with(summary: str, word: str, *, caching: bool = False) -> int:
    """Operations on layouts whose name has `word` (and ' with caching'), from a verify
    summary."""
    layouts = summary.split("; by layout: ", 1)[1].split("\n", 1)[0]
    return sum(
        int(n)
        for name, n in re.findall(r"([^,]+?) (\d+)(?:,|$)", layouts)
        if word in name and (not caching or name.endswith(" with caching"))
    )


@pytest.mark.parametrize("version", sorted(TYPES))
def test_full_variant_groups_identical_to_real(version):
    """10,000 hybrid operations at seed 7, of which >= 1,000 on layouts with each type the
    release has."""
    out = _python(version, _VERIFY, "none")
    assert out.returncode == 0, out.stdout + out.stderr
    # At least 10,000: a walk ends after the operation that crosses the budget (with Mamba
    # "align" draws, `new_step_starts` between operations counts as one).
    done = re.search(rf"v1-engine vs vLLM {re.escape(version)}: identical over (\d+) ", out.stdout)
    assert done is not None and int(done.group(1)) >= 10_000, out.stdout
    for word in TYPES[version]:
        assert _ops_with(out.stdout, word) >= 1_000, (word, out.stdout)
    # Prefix caching over each type (`variant_caching`; a ring layout with caching counts for
    # the ring): at seed 7, 1,402 / 200 (sink), 1,005 / 1,005 / 401 (R-SWA), 601 (ring).
    for word in TYPES[version]:
        assert _ops_with(out.stdout, word, caching=True) >= 200, (word, out.stdout)


@pytest.mark.parametrize(
    ("mutation", "version"),
    [
        ("sink-unreserved", "0.20.0"),
        # 0.26.0: on 0.33.0 the seed-7 walk (which also draws Mamba "align" there) no longer
        # reaches an R-SWA free that decides
        ("rswa-no-gap", "0.26.0"),
        ("rswa-gap-floor", "0.25.1"),
        ("ring-grows", "0.33.0"),
        ("variant-no-hit", "0.19.1"),
        ("variant-no-hit", "0.26.0"),
        ("ring-in-hit", "0.33.0"),
    ],
)
def test_the_comparison_catches_a_changed_rule(mutation, version):
    """The comparison can fail: sink blocks left free, an R-SWA group that frees nothing or
    frees the prompt's partial last block, a ring grown per block, and two wrong hit rules
    with caching on (a sink or R-SWA group left out of the hit; a ring looked up in it), each
    decide."""
    out = _python(version, _VERIFY, mutation)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


def test_layout_count_parse():
    summary = "x; by layout: full + Mamba 10, full + R-SWA + circular buffer 400, full + sink 7"
    assert _ops_with(summary, "R-SWA") == 400
    assert _ops_with(summary, "sink") == 7
    assert _ops_with(summary, "full") == 417
    cached = summary + ", full + sink with caching 5, full + R-SWA with caching 3"
    assert _ops_with(cached, "sink", caching=True) == 5
    assert _ops_with(cached, "R-SWA", caching=True) == 3
    assert _ops_with(cached, "R-SWA") == 403


_BUILD_SINK = """
import sys
from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.vllm_real.v1_adapter import RealKVCacheManager
groups = (KVCacheGroupSpec(), KVCacheGroupSpec(sink_len=8))
config = KVCacheConfig(num_gpu_blocks=20, block_size=4, kv_cache_groups=groups)
try:
    real = RealKVCacheManager(config, vllm_version=sys.argv[1])
except TypeError as exc:
    print("TypeError:", exc)
else:
    print("built, free", real.num_free_blocks)
"""


@pytest.mark.parametrize(
    ("version", "builds"),
    [("0.19.1", True), ("0.20.0", True), ("0.25.1", False), ("0.26.0", False), ("0.33.0", False)],
)
def test_the_real_sink_manager_builds_only_where_kvsim_models_it(version, builds):
    """`VllmPin.sink_manager_fails_to_build` against the wheels: 0.19.1 and 0.20.0 build the
    sink manager (taking 2 of 19 free blocks); later ones raise TypeError (vllm PR #44951),
    the same refusal kvsim gives a scenario there."""
    from sim.kv.pins import VllmPin

    out = _python(version, _BUILD_SINK, version)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("built, free 17" in out.stdout) == builds, out.stdout
    assert ("unexpected keyword argument" in out.stdout) == (not builds), out.stdout
    assert VllmPin(version).sink_manager_fails_to_build == (not builds)
    assert VllmPin(version).models_sink_groups == builds


_UNDER_KVSIM = """
import ast, sys
from sim.engine.run import run
from sim.scenario.schema import scenario_from_dict
from tests.scenario.test_full_variant_groups import _case
version, groups = sys.argv[1], ast.literal_eval(sys.argv[2])
data = _case(40, groups, version)
real = run(scenario_from_dict(data), vllm_root=f".vllm/{version}")
model = run(scenario_from_dict(data))
print("violations", len(real.violations), "finished", real.summary["states"]["finished"])
print("preemptions", real.summary["num_preemptions"], model.summary["num_preemptions"])
print("same tables", real.requests.equals(model.requests) and real.steps.equals(model.steps))
"""


@pytest.mark.parametrize(
    ("version", "groups"),
    [
        ("0.19.1", [{"sink_len": 16}, {}]),
        ("0.20.0", [{}, {"sink_len": 32}]),
        ("0.25.1", [{}, {"rswa_window": 24}]),
        ("0.33.0", [{}, {"circular_buffer": True}, {"rswa_window": 24}]),
    ],
)
def test_the_real_manager_under_kvsims_scheduler_gives_the_models_tables(version, groups):
    """The preemption cases of tests/scenario/test_full_variant_groups.py on the release's own
    manager (`run(vllm_root=...)`), full audit: no violation (the sink blocks count as held by
    no table on both), the same preemptions, and byte-identical request and step tables."""
    out = _python(version, _UNDER_KVSIM, repr(groups))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "violations 0 finished 6" in out.stdout, out.stdout
    (real, model) = re.search(r"preemptions (\d+) (\d+)", out.stdout).groups()
    assert real == model and int(real) > 0, out.stdout
    assert "same tables True" in out.stdout, out.stdout


_UNDER_KVSIM_CACHING = """
import ast, sys
from sim.engine.run import run
from sim.scenario.schema import scenario_from_dict
from tests.scenario.test_full_variant_groups import _case
version, groups = sys.argv[1], ast.literal_eval(sys.argv[2])
data = _case(40, groups, version)
data["cache"]["enable_prefix_caching"] = True
for request in data["workload"]["requests"]:  # a 64-token shared prefix
    request.update(prefix_id=1, prefix_tokens=min(64, request["prompt_tokens"]))
real = run(scenario_from_dict(data), vllm_root=f".vllm/{version}")
model = run(scenario_from_dict(data))
print("violations", len(real.violations), "finished", real.summary["states"]["finished"])
print("hit tokens", real.requests["num_prefix_hit_tokens"].sum())
print("same tables", real.requests.equals(model.requests) and real.steps.equals(model.steps))
"""


@pytest.mark.parametrize(
    ("version", "groups"),
    [
        ("0.20.0", [{}, {"sink_len": 32}]),
        ("0.26.0", [{"rswa_window": 24}, {}]),
        ("0.33.0", [{"circular_buffer": True}, {}, {"rswa_window": 24}]),
    ],
)
def test_with_caching_the_real_manager_under_kvsims_scheduler_gives_the_models_tables(
    version, groups
):
    """Prefix caching over the variants (`variant_caching`) on the release's own manager: the
    same preemption cases with a shared 64-token prefix, full audit: no violation, prefix
    hits, and byte-identical request and step tables."""
    out = _python(version, _UNDER_KVSIM_CACHING, repr(groups))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "violations 0 finished 6" in out.stdout, out.stdout
    hits = re.search(r"hit tokens (\d+)", out.stdout)
    assert hits is not None and int(hits.group(1)) > 0, out.stdout
    assert "same tables True" in out.stdout, out.stdout
