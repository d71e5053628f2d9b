"""Loading a real vLLM install for a test: a skip where it is not set up, a failure under CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _skip_reason(vllm_version: str, exc: Exception) -> str:
    """Why a test skips without vLLM `vllm_version`; under KVSIM_REQUIRE_VLLM=1 (CI) a failure
    instead, since a tier that silently skips would let CI pass without it."""
    if os.environ.get("KVSIM_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            f"KVSIM_REQUIRE_VLLM=1 but vLLM {vllm_version} is not set up: {exc}"
        ) from exc
    return f"vLLM {vllm_version} not set up: {exc}"


def load_or_skip(vllm_version: str):
    """The loaded vLLM `vllm_version` (`scripts/setup_vllm.sh`), or a skip (CI: a failure)."""
    from sim.vllm_real.loader import VllmNotAvailableError, load_vllm

    try:
        return load_vllm(vllm_version=vllm_version)
    except VllmNotAvailableError as exc:
        pytest.skip(_skip_reason(vllm_version, exc))


def root_or_skip(vllm_version: str) -> Path:
    """The install folder of vLLM `vllm_version`, or a skip (CI: a failure)."""
    from sim.vllm_real.loader import VllmNotAvailableError, resolve_root

    try:
        return resolve_root(vllm_version=vllm_version)
    except VllmNotAvailableError as exc:
        pytest.skip(_skip_reason(vllm_version, exc))


def root_or_skip_mark(vllm_version: str) -> Path | pytest.MarkDecorator:
    """As `root_or_skip`, at collection time: the folder, or a skip mark for the tests."""
    from sim.vllm_real.loader import VllmNotAvailableError, resolve_root

    try:
        return resolve_root(vllm_version=vllm_version)
    except VllmNotAvailableError as exc:
        return pytest.mark.skip(reason=_skip_reason(vllm_version, exc))
