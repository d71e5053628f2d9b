"""The KV pool as a vLLM release logs it at startup, for comparing kvsim with a server's log.

    GPU KV cache size: 28,137 tokens
    Maximum concurrency for 16,384 tokens per request: 27.48x

(0.33.0 prints both on one line.) The concurrency is the pool's blocks over the blocks the
startup check charges one `max_model_len` request (the sum over KV-cache groups,
`sim.scenario.startup.check_cache_fits`), in every release. The token figure changed at 0.25.1
(`VllmPin.logs_capacity_from_concurrency`): before, the pool's blocks per group times the block
size; from then on, int(concurrency x max_model_len), which for a hybrid model counts the
tokens of context the pool holds at peak rather than a slice of its blocks.

Example: 28,138 blocks of 16 tokens, one group, max_model_len 16,384 (1,024 blocks per
request): 0.11.0 logs 28,138 x 16 = 450,208 tokens and 28,138 / 1,024 = 27.48x; 0.33.0 logs
int(27.478... x 16,384) = 450,208 tokens too (equal when max_model_len is a whole number of
blocks and there is one group). A hybrid pool of 20,108 blocks in 2 groups charging 512 + 513
blocks per 8,192-token request (full attention + a 4,096-token window) logs 20,108 // 2 x 16 =
160,864 tokens on 0.20.0 and int(20,108 / 1,025 x 8,192) = 160,707 on 0.25.1, both at 19.62x.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoggedKVCache:
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int

    def lines(self) -> list[str]:
        return [
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x",
        ]


def logged_kv_cache(
    num_blocks: int,
    num_groups: int,
    block_size: int,
    max_model_len: int,
    blocks_per_request: int,
    *,
    from_concurrency: bool,
) -> LoggedKVCache:
    """What the release logs for a pool of `num_blocks` (the null block included, as vLLM's
    `kv_cache_config.num_blocks`)."""
    concurrency = num_blocks / blocks_per_request
    if from_concurrency:
        tokens = int(concurrency * max_model_len)
    else:
        tokens = num_blocks // num_groups * block_size
    return LoggedKVCache(tokens, concurrency, max_model_len)
