"""The worked examples in `sim.vllm_bench`'s docstrings hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["sim.vllm_bench.serve_line", "sim.vllm_bench.importer", "sim.vllm_bench.models",
           "sim.vllm_bench.datasets", "sim.vllm_bench.arrivals", "sim.vllm_bench.log_pool"]  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    failures, tried = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
