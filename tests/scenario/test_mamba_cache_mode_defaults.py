"""The Mamba cache mode each release runs (`sim.scenario.vllm_defaults.mamba`), and
`vllm serve --mamba-cache-mode` through `kvsim import-vllm`."""

from __future__ import annotations

import pytest
import yaml

from sim.errors import InputError
from sim.kv.pins import VllmPin
from sim.scenario.vllm_defaults.common import Origin
from sim.scenario.vllm_defaults.mamba import resolve_mamba_cache_mode
from sim.vllm_bench.importer import import_serve_line

ALL_RELEASES = [VllmPin.V0_19_1, VllmPin.V0_20_0, VllmPin.V0_25_1, VllmPin.V0_26_0]


@pytest.mark.parametrize("release", ALL_RELEASES)
def test_the_2026_releases_pick_all_for_mamba2_family_models(release):
    """Caching on, no mode given: "all" where the model supports it (Nemotron-H), "align"
    where it does not (Qwen3-Next) or kvsim does not know the model; caching off: "none"."""
    assert resolve_mamba_cache_mode(release, True, None, True).value == "all"
    assert resolve_mamba_cache_mode(release, True, None, False).value == "align"
    unknown = resolve_mamba_cache_mode(release, True, None, None)
    assert unknown.value == "align" and "model unknown" in unknown.rule
    assert resolve_mamba_cache_mode(release, False, "all", True).value == "none"
    # "all" asked of a model without it falls back; "none" with caching on is derived.
    assert resolve_mamba_cache_mode(release, True, "all", False).value == "align"
    assert resolve_mamba_cache_mode(release, True, "none", True).value == "all"
    user = resolve_mamba_cache_mode(release, True, "align", True)
    assert (user.value, user.origin) == ("align", Origin.USER)


def test_0_33_0_has_align_only_and_0_11_0_no_mode():
    assert resolve_mamba_cache_mode(VllmPin.V0_33_0, True, None, True).value == "align"
    with pytest.raises(InputError, match="0.33.0 has no 'all' mode"):
        resolve_mamba_cache_mode(VllmPin.V0_33_0, True, "all", True)
    assert resolve_mamba_cache_mode(VllmPin.V0_11_0, True, None, True).value == "none"


@pytest.mark.parametrize(("flag", "expected"), [("align", "align"), ("all", "all")])
def test_import_vllm_maps_mamba_cache_mode(flag, expected):
    line = f"vllm serve llama-3.1-8b --mamba-cache-mode {flag}"
    data = yaml.safe_load(import_serve_line(line, gpu="h100-sxm", version="0.25.1"))
    assert data["cache"]["mamba_cache_mode"] == expected


def test_import_vllm_leaves_mode_none_to_the_release():
    line = "vllm serve llama-3.1-8b --mamba-cache-mode none"
    data = yaml.safe_load(import_serve_line(line, gpu="h100-sxm", version="0.25.1"))
    assert "mamba_cache_mode" not in data.get("cache", {})


@pytest.mark.parametrize(
    ("model", "release", "mode"),
    [
        ("nemotron-h-8b", "0.25.1", "all"),  # Mamba2 family: SupportsMambaPrefixCaching
        ("qwen3-next-80b-a3b", "0.25.1", "align"),  # gated delta net: does not declare it
        ("nemotron-h-8b", "0.19.1", "all"),
    ],
)
def test_a_catalog_hybrid_runs_the_mode_its_vllm_class_picks(model, release, mode) -> None:
    """Regression: a catalog hybrid (`sim.scenario.catalog_layout`) resolved its Mamba cache
    mode as an abstract model ("align"), where vLLM runs Nemotron-H in "all"."""
    from pathlib import Path

    from sim.engine.engine import Engine
    from sim.scenario.resolve import resolve
    from sim.scenario.schema import scenario_from_dict

    data = {
        "name": "catalog-mamba",
        "model": model,
        "hardware": {"gpu": "h100-sxm"},
        "cache": {"num_gpu_blocks": 400},
        "scheduler": {"design": "v1-engine", "vllm_version": release, "max_model_len": 8192},
        "workload": {
            "kind": "inline",
            "requests": [
                {"arrival_s": 0.0, "prompt_tokens": 2000, "output_tokens": 8},
                {"arrival_s": 0.1, "prompt_tokens": 2000, "output_tokens": 8},
            ],
        },
    }
    resolved = resolve(scenario_from_dict(data), Path("."))
    assert resolved.inputs["mamba_cache_mode"] == mode
    records = Engine(resolved.engine, resolved.workload.requests, resolved.step_time).run()
    assert not records.violations


@pytest.mark.parametrize("caching", [None, True])
def test_0_11_0_serves_a_catalog_mamba_hybrid_without_prefix_caching(caching) -> None:
    """Regression (compare-versions refused Nemotron-H on 0.11.0): vLLM 0.11.0's
    `MambaModelConfig.verify_and_update_config` turns prefix caching off for Mamba hybrids
    (`model_executor/models/config.py:L290-297`), whatever `vllm serve` was given; kvsim
    runs it so and names the override when the user asked for caching."""
    from pathlib import Path

    from sim.engine.engine import Engine
    from sim.scenario.resolve import resolve
    from sim.scenario.schema import scenario_from_dict

    cache: dict = {"num_gpu_blocks": 400}
    if caching is not None:
        cache["enable_prefix_caching"] = caching
    data = {
        "name": "mamba-on-0.11.0",
        "model": "nemotron-h-8b",
        "hardware": {"gpu": "h100-sxm"},
        "cache": cache,
        "scheduler": {"design": "v1-engine", "vllm_version": "0.11.0", "max_model_len": 8192},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 2000, "output_tokens": 8}] * 2,
        },
    }
    resolved = resolve(scenario_from_dict(data), Path("."))
    setting = resolved.inputs["settings"]["enable_prefix_caching"]
    assert setting["value"] is False and "L290-297" in setting["rule"]
    assert resolved.inputs["mamba_cache_mode"] == "none"
    overridden = "cache.enable_prefix_caching" in resolved.inputs["settings_overridden"]
    assert overridden is (caching is True)
    records = Engine(resolved.engine, resolved.workload.requests, resolved.step_time).run()
    assert not records.violations and records.requests.num_rows == 2
