"""Mamba prefix caching in scenarios (`cache.enable_prefix_caching: true` with Mamba groups,
vLLM's modes "align" and "all" on 0.19.1-0.26.0, "align" with prefill checkpoint blocks on
0.33.0, `kvsim run` of catalog hybrids end to end): the full audit finds no mismatch on tight
random full + Mamba hybrids, prefill chunks end on block boundaries ("align"), the startup
check charges two pages per Mamba group ("align") or one per block ("all"), and the refusals
name their field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.run import run
from sim.scenario.resolve import resolve
from sim.scenario.schema import ScenarioError, scenario_from_dict
from sim.vllm_real.sched_lockstep import KvsimSide
from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase

ALIGN_RELEASES = ["0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]


def _scenario(version: str, num_gpu_blocks: int, groups, bs: int = 16, **scheduler) -> dict:
    return {
        "name": "mamba-align",
        "model": None,
        "cache": {
            "block_size": bs,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": 0,
            "enable_prefix_caching": True,
            "kv_cache_groups": groups,
        },
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": version,
            "max_model_len": 256,
            "max_num_batched_tokens": 40,
            "max_num_seqs": 8,
            "enable_chunked_prefill": True,
            "async_scheduling": False,
            **scheduler,
        },
        "engine": {"violation_policy": "record", "audit_level": "full"},
        "workload": {
            "kind": "inline",
            "requests": [
                {"arrival_s": 0.001 * i, "prompt_tokens": 40 + 37 * i, "output_tokens": 30}
                for i in range(6)
            ],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


@st.composite
def _align_cases(draw):
    """1-2 full and 1-3 Mamba groups in any order, caching on, on the tightest pools the
    startup check accepts (a full group max_model_len / bs blocks, a Mamba group 2)."""
    bs = draw(st.sampled_from([2, 4, 8, 16]))
    max_model_len = draw(st.integers(2 * bs, 16 * bs))
    groups = [{}] * draw(st.integers(1, 2)) + [{"mamba": True}] * draw(st.integers(1, 3))
    groups = draw(st.permutations(groups))
    budget = draw(st.integers(max(8, bs), max(8, bs, max_model_len)))
    version = draw(st.sampled_from(ALIGN_RELEASES))
    mode = "align" if version == "0.33.0" else draw(st.sampled_from(["align", "all"]))
    mamba_pages = 2 if mode == "align" else -(-max_model_len // bs)
    need = sum(mamba_pages if g.get("mamba") else -(-max_model_len // bs) for g in groups)
    data = _scenario(version, need + 1 + draw(st.integers(0, need // 2)), groups, bs)
    data["cache"]["mamba_cache_mode"] = mode
    # Async scheduling too, except 0.26.0's "align", whose async state leak (vllm #55450) is
    # kept as tests/regressions/v1_engine_0_26_0_mamba_align_async_state_leak_vllm_55450.yaml.
    async_ok = not (version == "0.26.0" and mode == "align")
    data["scheduler"]["async_scheduling"] = async_ok and draw(st.booleans())
    data["scheduler"].update(max_model_len=max_model_len, max_num_batched_tokens=budget)
    requests = []
    for i in range(draw(st.integers(2, 12))):
        prompt = draw(st.integers(1, max_model_len - 1))
        request = {
            "arrival_s": 0.02 * i,
            "prompt_tokens": prompt,
            "output_tokens": draw(st.integers(1, 6 * bs)),
        }
        if draw(st.booleans()):  # a shared prefix (2 keys), so Mamba states are hit
            # Half of them the whole prompt: a repeat hits the state its first run cached at
            # its last block boundary (a partial prefix is hit only where a chunk ended).
            shared = prompt if draw(st.booleans()) else draw(st.integers(1, prompt))
            request.update(prefix_id=draw(st.integers(0, 1)), prefix_tokens=shared)
        requests.append(request)
    data["workload"] = {"kind": "inline", "requests": requests}
    return data


@settings(max_examples=30, deadline=None)
@given(data=_align_cases())
def test_no_mismatch_on_random_tight_mamba_hybrids_with_caching(data):
    """Full audit (conservation, ownership, refcounts, admission counts, footprint): no
    violation, every request finishes."""
    result = run(scenario_from_dict(data))
    assert len(result.violations) == 0, (data, result.violations)
    assert result.summary["states"]["finished"] == len(data["workload"]["requests"])


@pytest.mark.parametrize("version", ALIGN_RELEASES)
def test_repeated_prompts_hit_the_cached_mamba_state(version):
    """Six repeats of a 100-token prompt (bs=16), arriving after the first has finished its
    prefill: each repeat hits 96 tokens (the state cached at the last block boundary, 96);
    the audit holds."""
    data = _scenario(version, 80, [{"mamba": True}, {}])
    data["workload"]["requests"] = [
        {
            "arrival_s": 0.5 * i,
            "prompt_tokens": 100,
            "output_tokens": 10,
            "prefix_id": 3,
            "prefix_tokens": 100,
        }
        for i in range(6)
    ]
    result = run(scenario_from_dict(data))
    assert len(result.violations) == 0, result.violations
    assert list(result.requests["num_prefix_hit_tokens"]) == [0] + [96] * 5


@pytest.mark.parametrize("version", ALIGN_RELEASES)
def test_prefill_chunks_end_on_block_boundaries(version):
    """kvsim's scheduler on a full + Mamba pool with caching (budget 40, bs=16): every prefill
    chunk that stops before its prompt's last block boundary ends on a boundary, and some do."""
    case = SchedCase(80, 16, 256, 8, 40, enable_prefix_caching=True, mamba_groups=1)
    side = KvsimSide(case, version)
    prompts = {}
    for i in range(6):
        spec = RequestSpec(i, ((1000 + i, 40 + 37 * i),), 30, 0, i / 1000)
        prompts[i] = 40 + 37 * i
        side.add_request(spec)
    computed = dict.fromkeys(prompts, 0)
    checked = 0
    for step in range(400):
        if not side.has_unfinished():
            break
        for rid, tokens in side.step(float(step)).scheduled:
            prompt = prompts[rid]
            end = computed[rid] + tokens
            if computed[rid] < prompt and end < prompt - prompt % 16:
                assert end % 16 == 0, (rid, computed[rid], tokens)
                checked += 1
            computed[rid] = end
    assert not side.has_unfinished()
    assert checked >= 6


def test_startup_charges_a_page_per_block_per_mamba_group_in_mode_all():
    """Mode "all": `cdiv(max_model_len, bs)` pages per Mamba group, as a full group: 48
    usable blocks start with two Mamba groups and max_model_len 256, 47 do not."""
    groups = [{"mamba": True}, {"mamba": True}, {}]
    data = _scenario("0.25.1", 49, groups)
    data["cache"]["mamba_cache_mode"] = "all"
    assert resolve(scenario_from_dict(data)).inputs["mamba_cache_mode"] == "all"
    data["cache"]["num_gpu_blocks"] = 48
    with pytest.raises(ScenarioError, match="needs 48 blocks but only 47"):
        resolve(scenario_from_dict(data))


def test_mode_all_is_refused_on_0_33_0():
    data = _scenario("0.33.0", 80, [{"mamba": True}, {}])
    data["cache"]["mamba_cache_mode"] = "all"
    with pytest.raises(ScenarioError, match="cache.mamba_cache_mode: vLLM 0.33.0 has no 'all'"):
        resolve(scenario_from_dict(data))


def test_startup_charges_two_pages_per_mamba_group():
    """`MambaSpec.max_memory_usage_bytes` in "align": 2 pages. With max_model_len 256 (16
    blocks of 16 for the full group) and two Mamba groups, 20 usable blocks start; 19 do
    not (caching off: 18 would)."""
    groups = [{"mamba": True}, {"mamba": True}, {}]
    resolve(scenario_from_dict(_scenario("0.19.1", 21, groups)))
    with pytest.raises(ScenarioError, match="needs 20 blocks but only 19"):
        resolve(scenario_from_dict(_scenario("0.19.1", 20, groups)))


@pytest.mark.parametrize(
    ("version", "groups", "message"),
    [
        ("0.11.0", [{"mamba": True}, {}], "models on 0.19.1 to 0.33.0, not 0.11.0"),
        ("0.26.0", [{"mamba": True}, {"sliding_window": 8}, {}], "full-attention plus Mamba"),
        ("0.33.0", [{"mamba": True}, {"sliding_window": 8}, {}], "full-attention plus Mamba"),
    ],
    ids=["0.11.0", "with-sliding", "with-sliding-0.33.0"],
)
def test_refusals_name_the_field(version, groups, message):
    with pytest.raises(ScenarioError, match=f"cache.enable_prefix_caching: .*{message}"):
        resolve(scenario_from_dict(_scenario(version, 80, groups)))


@pytest.mark.parametrize("mode", ["align", "all"])
@pytest.mark.parametrize("version", ["0.19.1", "0.26.0"])
def test_decode_shortcuts_change_no_table_with_mamba_caching(version, mode):
    """The decode fast path and cohort skip quiet decodes by each group's touch length (an
    "align" Mamba group's: the first decode that frees one of its real blocks): the request
    and step tables are the same without them."""
    data = _scenario(version, 120, [{"mamba": True}, {}, {"mamba": True}], bs=8)
    data["scheduler"]["max_model_len"] = 96
    data["cache"]["mamba_cache_mode"] = mode
    data["workload"]["requests"] = [
        {
            "arrival_s": 0.03 * i,
            "prompt_tokens": 20 + 9 * i,
            "output_tokens": 60,
            "prefix_id": i % 2,
            "prefix_tokens": 16,
        }
        for i in range(6)
    ]
    fast = run(scenario_from_dict(data))
    data["scheduler"].update(decode_fast_path=False, decode_cohort=False)
    slow = run(scenario_from_dict(data))
    assert len(fast.violations) == 0 and len(slow.violations) == 0
    for name in ("requests", "steps"):
        assert getattr(fast, name).equals(getattr(slow, name)), name
    assert fast.summary["num_preemptions"] > 0 or fast.summary["states"]["finished"] == 6


@pytest.mark.parametrize("version", ["0.11.0"])
def test_kvsim_run_refuses_caching_on_other_releases_in_one_line(version, tmp_path):
    """`kvsim run` of the Mamba example with caching on a release kvsim does not model it
    for: one line naming the field and the release, exit 2."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    root = Path(__file__).resolve().parents[2]
    args = ["run", str(root / "scenarios" / "mamba_hybrid_v1.yaml"), "--no-plots"]
    args += ["--set", "cache.enable_prefix_caching=true"]
    args += ["--set", f"scheduler.vllm_version={version}", "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "cache.enable_prefix_caching: " in result.output and f"not {version}" in result.output


_CATALOG_RUN = """
name: catalog-hybrid-0.33.0-caching
model: {model}
hardware: {{gpu: h100-sxm}}
cache: {{num_gpu_blocks: 400, enable_prefix_caching: true}}
scheduler: {{design: v1-engine, vllm_version: "0.33.0", max_model_len: 8192}}
engine: {{violation_policy: record, audit_level: full}}
workload:
  kind: inline
  requests:
{requests}
"""


@pytest.mark.parametrize("model", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_kvsim_run_of_a_catalog_hybrid_on_0_33_0_with_caching(model, tmp_path):
    """`kvsim run` of a catalog hybrid on 0.33.0 with prefix caching (what `vllm serve` runs
    by default): "align" with a prefill checkpoint block and sparse retention, exit 0, the
    full audit clean.
    Four 3,000-token prompts sharing 2,500 tokens, one at a time: the first runs its prompt
    in one chunk (only the checkpoint at its last block boundary is a Mamba state), so the
    second hits nothing but stops its chunk at the shared-prefix junction; the third and
    fourth hit that state."""
    import json

    from typer.testing import CliRunner

    from sim.cli.main import app

    requests = "\n".join(
        f"    - {{arrival_s: {i}.0, prompt_tokens: 3000, output_tokens: 8, prefix_id: 1, "
        "prefix_tokens: 2500}"
        for i in range(4)
    )
    path = tmp_path / "scenario.yaml"
    path.write_text(_CATALOG_RUN.format(model=model, requests=requests))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(path), "--no-plots", "-o", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["inputs"]["mamba_cache_mode"] == "align"
    assert summary["inputs"]["mamba_prefill_checkpoint_blocks"] == 1
    assert summary["inputs"]["prefix_cache_retention_interval"] == 0  # vllm serve's default
    assert (out / "violations.csv").read_text().count("\n") <= 1  # the header only
    rows = (out / "requests.csv").read_text().splitlines()
    header = rows[0].split(",")
    hits = [int(row.split(",")[header.index("num_prefix_hit_tokens")]) for row in rows[1:]]
    states = [row.split(",")[header.index("state")] for row in rows[1:]]
    assert states == ['"finished"'] * 4
    assert hits[:2] == [0, 0] and 0 < hits[2] == hits[3] <= 2500, hits
