"""`kvsim calibrate --from-log`: the scenario's KV pool replaced by the one a server logged.

`--from-log SERVER_LOG` (`sim.vllm_bench.server_log`) replaces the scenario's pool with the one the
server logged ("GPU KV cache size: N tokens"), so the replays queue as the measured server did;
the log's release is recorded beside the one the scenario models. Without `--scenario`, the
log's "non-default args" on `--gpu` are the server (`sim.cli.calibrate._bench_scenario`).
Example (a release before 0.25.1, whose log gives the pool itself): 100,000 tokens at
block size 16 in one KV cache group become `cache.num_gpu_blocks: 6250`
(`ServerLog.pool_blocks`):

    >>> from pathlib import Path
    >>> ServerLog(Path("server.log"), 100_000, None, "0.11.0").pool_blocks(16)
    6250
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.kv.pins import resolve_pin
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario
from sim.vllm_bench.bench import prepared
from sim.vllm_bench.server_log import ServerLog


def apply_server_log(
    scenario: Scenario, base_dir: Path, log: ServerLog
) -> tuple[Scenario, dict[str, Any]]:
    """The scenario with the log's KV pool as `cache.num_gpu_blocks`, and what was applied."""
    resolved = prepared(scenario, base_dir)
    kv = resolved.engine.kv
    groups = len(resolved.inputs.get("kv_cache_groups") or ()) or 1
    blocks = log.pool_blocks(
        kv.block_size,
        groups,
        from_concurrency=resolve_pin(
            scenario.scheduler.design, resolved.inputs["vllm_version"]
        ).logs_capacity_from_concurrency,
        blocks_per_request=resolved.inputs.get("startup_blocks_per_request"),
        max_model_len=resolved.inputs.get("max_model_len"),
    )
    applied = {
        "log": str(log.path),
        "kv_cache_tokens": log.kv_cache_tokens,
        "gpu_blocks_logged": log.gpu_blocks,
        "num_gpu_blocks": blocks,
        "kvsim_num_gpu_blocks": kv.num_gpu_blocks,
        "vllm_version_logged": log.vllm_version,
        "vllm_version_modelled": resolved.inputs.get("vllm_version"),
    }
    overridden = apply_overrides(scenario, {"cache.num_gpu_blocks": blocks}, source=str(log.path))
    return overridden, applied
