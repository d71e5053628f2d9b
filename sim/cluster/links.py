"""KV-transfer links between a prefill and a decode replica, and the time a transfer takes.

The figures live in `sim/data/links.yaml`, each with its source; `get_link("rdma-400g")` looks
one up (case-insensitive) and a dict with the `LinkSpec` fields defines a link outside the
catalog, as a scenario's `model:` may.

What moves: vLLM 0.11.0's NIXL connector has the decode worker read the prompt's KV blocks
from the prefill worker, whole blocks (`remote_block_ids`, nixl_connector.py:L441-451 and
`_read_blocks`, L1240-1312 @0.11.0), layer by layer. So the bytes are
`cdiv(prompt_tokens, block_size) * block_bytes`, with `block_bytes` the model's KV geometry
(`sim.memory.block_bytes`, all layers, all KV heads). Under tensor parallelism each rank
holds `1/tp` of the heads and reads its own shard over its own link (one NIC per GPU), so
`min(tp_prefill, tp_decode)` streams move the bytes in parallel.

Worked example (Llama-3.1-8B bf16, block_size 16, 2,000-token prompt, rdma-400g, tp 1):
125 blocks x 2,097,152 B = 262,144,000 B; 400 Gb/s x 0.9 = 45 GB/s, so
262,144,000 / 45e9 = 5.825 ms, plus 20 us latency = 5.845 ms.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.errors import InputError
from sim.scenario.fields import Float


class LinkSpec(BaseModel):
    """One link: line rate per direction, the share of it achieved, and a fixed latency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display_name: str = ""
    bandwidth_Gbps: Float = Field(gt=0)
    efficiency: Float = Field(gt=0, le=1)
    latency_us: Float = Field(ge=0)
    source: str = "user-defined"

    @property
    def effective_Bps(self) -> float:
        """Bytes per second one stream achieves: 400 Gb/s x 0.9 -> 45e9 B/s."""
        return self.bandwidth_Gbps * 1e9 / 8 * self.efficiency


@functools.cache
def _catalog() -> dict[str, LinkSpec]:
    text = resources.files("sim.data").joinpath("links.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)["links"]
    return {name: LinkSpec(name=name, **fields) for name, fields in data.items()}


def link_names() -> list[str]:
    return sorted(_catalog())


def get_link(link: str | dict[str, Any] | LinkSpec) -> LinkSpec:
    """A catalog link by name, or a link defined by a dict of `LinkSpec` fields."""
    if isinstance(link, LinkSpec):
        return link
    if isinstance(link, dict):
        try:
            return LinkSpec.model_validate({"name": "custom", **link})
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputError(f"link.{where}: {first['msg']}") from None
    found = _catalog().get(link.lower())
    if found is None:
        raise InputError(f"unknown link {link!r}; known: {', '.join(link_names())}")
    return found


def kv_transfer_bytes(num_prompt_tokens: int, block_size: int, block_bytes: int) -> int:
    """Bytes of the prompt's KV blocks (whole blocks move): 2,000 tokens, bs 16, 2 MiB
    blocks -> 125 x 2,097,152 = 262,144,000."""
    num_blocks = -(-num_prompt_tokens // block_size)
    return num_blocks * block_bytes


def transfer_time_s(num_bytes: int, link: LinkSpec, num_streams: int = 1) -> float:
    """Seconds to move `num_bytes` over `num_streams` parallel copies of `link`.

    Example: 262,144,000 B over rdma-400g (45e9 B/s per stream, 20 us): 1 stream 5.845 ms,
    2 streams 262,144,000 / 90e9 + 20 us = 2.933 ms.
    """
    if num_streams < 1:
        raise ValueError(f"num_streams must be >= 1, got {num_streams}")
    return link.latency_us * 1e-6 + num_bytes / (link.effective_Bps * num_streams)
