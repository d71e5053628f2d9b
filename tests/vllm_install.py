"""Loading a real vLLM install for a test: a skip where it is not set up, a failure under CI."""

from __future__ import annotations

import os

import pytest


def load_or_skip(vllm_version: str):
    """The loaded vLLM `vllm_version` (`scripts/setup_vllm.sh`), or a skip; under
    KVSIM_REQUIRE_VLLM=1 (CI) a failure, since a tier that silently skips would let CI pass
    without it."""
    from sim.vllm_real.loader import VllmNotAvailableError, load_vllm

    try:
        return load_vllm(vllm_version=vllm_version)
    except VllmNotAvailableError as exc:
        if os.environ.get("KVSIM_REQUIRE_VLLM") == "1":
            raise RuntimeError(
                f"KVSIM_REQUIRE_VLLM=1 but vLLM {vllm_version} is not set up: {exc}"
            ) from exc
        pytest.skip(f"vLLM {vllm_version} not set up: {exc}")
