"""benchmarks/calibrate_public_server.py turns one public server's measurements into the bench
files `kvsim calibrate --from-bench` fits (the fit itself takes minutes: run the script)."""

from __future__ import annotations

from tests.benchmarks.scripts import load_script


def test_a_group_is_one_server_with_its_runs_and_measured_metrics():
    module = load_script("calibrate_public_server")
    files, scenario = module.bench_files("dl-qwen2-7b-a100-tp1-u05-in1024-out1024")
    assert sorted(f.workload.num_prompts for f in files) == [1, 10, 50, 100, 500]
    assert all({"mean_ttft_ms", "mean_tpot_ms"} <= set(f.measured) for f in files)
    assert scenario.hardware.gpu == "a100-80gb-sxm"
    assert scenario.cache.gpu_memory_utilization == 0.5
