"""What a `vllm serve` startup log says about the KV pool, for `kvsim calibrate --from-log`.

The lines read (as vLLM prints them; the wording is stable across the releases kvsim pins):

  V1 engine   "GPU KV cache size: 450,192 tokens" (`kv_cache_utils.py`, once per engine core;
              the smallest is the pool a TP group runs with)
  v0 engine   "# GPU blocks: 5961, # CPU blocks: 2048" (`executor_base.py` / `gpu_executor.py`)
  release     "vLLM API server version 0.10.1.1", "Initializing a V1 LLM engine (v0.10.1.1)", or
              the banner's "version 0.17.0" (from 0.12)
  settings    "non-default args: {'model_tag': 'Qwen/Qwen3-0.6B', 'max_num_seqs': 64, ...}"
              (`log_non_default_args`: 0.11.0 `vllm/entrypoints/utils.py` L208-233, 0.25.1
              `entrypoints/serve/utils/api_utils.py` L273, 0.33.0
              `entrypoints/common/startup.py` L94-96), a Python dict of every `vllm serve`
              option whose value differs from the release's default, keyed by option `dest`
              (`read_serve_settings`, for `kvsim import-vllm --from-log`)

Anything else in the log is ignored. The pool replaces the scenario's `cache.num_gpu_blocks`
(`pool_blocks`), so the replay queues as the measured server did even where kvsim's memory
derivation would size the pool differently.

Example (0.20.0 and earlier): "GPU KV cache size: 450,192 tokens" with 16-token blocks and one
KV-cache group is 450,192 // 16 = 28,137 blocks; a hybrid model of two groups logs num_blocks //
2 * 16 tokens, so the same line means 56,274 blocks. From 0.25.1 the line is int(concurrency x
max_model_len) tokens instead (`ServerLog.pool_blocks`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.files.inputs import read_capped_bytes, refuse_non_regular

#: A startup log is a few hundred KB; refuse anything far larger than that (a wrong file).
MAX_LOG_BYTES = 64 * 2**20

_V1_POOL = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_V0_POOL = re.compile(r"# GPU blocks:\s*([\d,]+)")
_VERSION = re.compile(
    r"(?:vLLM API server version|Initializing a V1 LLM engine \(v?|\u2580\u2584\u2580 \u2588\s+version)"
    r"\s*v?(\d+\.\d+\.\d+[\w.+-]*)"
)
_SETTINGS = re.compile(r"non-default args: (\{.*\})\s*$")


@dataclass(frozen=True, slots=True)
class ServerLog:
    path: Path
    #: V1: the smallest "GPU KV cache size" in tokens; None where the log has none.
    kv_cache_tokens: int | None
    #: v0: "# GPU blocks"; None where the log has none.
    gpu_blocks: int | None
    vllm_version: str | None

    def pool_blocks(
        self,
        block_size: int,
        num_kv_groups: int = 1,
        *,
        from_concurrency: bool = False,
        blocks_per_request: int | None = None,
        max_model_len: int | None = None,
    ) -> int:
        """The pool in blocks (see the module docstring's example). From 0.25.1 the logged
        tokens are int(concurrency x max_model_len) (`sim.memory.logged`), so with
        `from_concurrency` the pool is tokens x blocks_per_request / max_model_len, rounded up
        (the int() dropped less than one request's worth of a token per block).

        Example: 160,707 tokens, 1,025 blocks per 8,192-token request: 160,707 x 1,025 /
        8,192 = 20,107.9 -> 20,108 blocks."""
        if self.kv_cache_tokens is None:
            assert self.gpu_blocks is not None
            return self.gpu_blocks
        if not from_concurrency:
            return self.kv_cache_tokens // block_size * num_kv_groups
        if blocks_per_request is None or max_model_len is None:
            raise ValueError("from_concurrency needs blocks_per_request and max_model_len")
        return -(-self.kv_cache_tokens * blocks_per_request // max_model_len)


def _log_text(path: Path) -> str:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    refuse_non_regular(path, lambda reason: InputError(f"{path}: {reason} (a vllm serve log)"))
    raw = read_capped_bytes(
        path, MAX_LOG_BYTES, lambda n: InputError(f"{path}: {n} bytes, too big")
    )
    return raw.decode("utf-8", errors="replace")


def log_release(text: str) -> str | None:
    """The release a log names. Example: '... version 0.17.0' (the banner) -> '0.17.0'."""
    version = _VERSION.search(text)
    return version.group(1) if version else None


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What the log's "non-default args" line says the server was started with."""

    #: Option `dest` -> value as the release's parser stored it (`model_tag` included).
    values: dict[str, Any]
    #: The release the log names, if any.
    vllm_version: str | None
    #: 1-based line of the settings in the log.
    line: int


def read_serve_settings(path: Path) -> ServeSettings:
    """The last "non-default args" line of a `vllm serve` log (a restarted server's log holds
    several; the last one ran). Bad input naming the file and line: no such line, or a value
    that is not a Python literal (an object's repr, such as a LoRA module path)."""
    text = _log_text(path)
    found: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _SETTINGS.search(line)
        if match is not None:
            found = (number, match.group(1))
    if found is None:
        raise InputError(
            f"{path}: no 'non-default args: {{...}}' line: not a vllm serve log of 0.6 or "
            "later, or one cut before the server read its options"
        )
    number, literal = found
    try:
        values = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise InputError(
            f"{path}:{number}: non-default args: a value kvsim cannot read (not a Python "
            "literal); pass the vllm serve command line instead"
        ) from None
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise InputError(f"{path}:{number}: non-default args: not a dict of option names")
    return ServeSettings(values, log_release(text), number)


def read_server_log(path: Path) -> ServerLog:
    """Parse a startup log; a missing or non-regular file, or one with no pool line, is bad
    input naming it."""
    text = _log_text(path)
    tokens = [int(m.group(1).replace(",", "")) for m in _V1_POOL.finditer(text)]
    blocks = [int(m.group(1).replace(",", "")) for m in _V0_POOL.finditer(text)]
    if not tokens and not blocks:
        raise InputError(
            f"{path}: no 'GPU KV cache size: N tokens' (V1) or '# GPU blocks: N' (v0) line: "
            "not a vllm serve startup log, or one cut before the KV cache was sized"
        )
    return ServerLog(
        path,
        min(tokens) if tokens else None,
        min(blocks) if blocks else None,
        log_release(text),
    )
