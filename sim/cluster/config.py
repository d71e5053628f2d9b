"""The scenario's `cluster:` section: co-located (the default, unchanged) or disaggregated.

Example (one prefill and three decode H100s over 400 Gb/s RDMA)::

    cluster:
      mode: disaggregated
      prefill: {replicas: 1, gpu: h100-sxm, tp: 1}
      decode: {replicas: 3, gpu: h100-sxm, tp: 1}
      link: rdma-400g

A pool's `gpu` and `tp` replace `hardware:` for that pool (its KV pool is derived from its own
GPU memory when `cache.num_gpu_blocks` is `derive`); `engine.num_replicas` is ignored in
disaggregated mode (each pool has its own count). `link` is a catalog name
(`sim/data/links.yaml`) or a dict of `LinkSpec` fields.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim.cluster.links import get_link
from sim.errors import InputError
from sim.scenario.fields import Int

#: The routers a pool (or `engine.router`) may name (`sim.routing.Router`'s values).
RouterName = Literal[
    "round_robin",
    "least_outstanding",
    "least_kv_usage",
    "prefix_cache_aware",
    "session_affinity",
]


class ClusterMode(enum.Enum):
    CO_LOCATED = "co-located"
    DISAGGREGATED = "disaggregated"


class PoolSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: Int = Field(default=1, ge=1)
    #: None: the scenario's `hardware.gpu`.
    gpu: str | dict[str, Any] | None = None
    #: None: the scenario's `hardware.tensor_parallel_size`.
    tp: Int | None = Field(default=None, ge=1)
    #: None: the scenario's `engine.router`.
    router: RouterName | None = None


class ClusterSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: ClusterMode = ClusterMode.CO_LOCATED
    prefill: PoolSection = PoolSection()
    decode: PoolSection = PoolSection()
    link: str | dict[str, Any] = "rdma-400g"

    @field_validator("link")
    @classmethod
    def _known_link(cls, link: str | dict[str, Any]) -> str | dict[str, Any]:
        try:
            get_link(link)
        except InputError as error:
            raise ValueError(str(error)) from None
        return link

    @property
    def num_gpus(self) -> int | None:
        """GPUs of a disaggregated cluster (replicas x tp over both pools); None if a pool
        takes its tp from `hardware:` (the caller knows it)."""
        if self.prefill.tp is None or self.decode.tp is None:
            return None
        return self.prefill.replicas * self.prefill.tp + self.decode.replicas * self.decode.tp
