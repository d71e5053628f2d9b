"""kvsim: a discrete-event simulator of an LLM-serving engine's scheduler and paged KV cache.

`import sim` never imports torch (kernel timing lives in the separate `calibrate` package) and
imports nothing heavy: the public API loads on first use::

    result = sim.run("scenario.yaml")                                        # RunResult
    table  = sim.sweep("scenario.yaml", {"workload.rate_scale": [1, 2, 4]})  # DataFrame
    cap    = sim.capacity("scenario.yaml", ["ttft_p99=2s"], target_rate=50)  # DataFrame
    diff   = sim.compare_versions("scenario.yaml")  # DataFrame: one row per vLLM design
"""

from __future__ import annotations

import importlib

from sim import native as _native

__version__ = "0.1.0"

# The compiled core if one is built and current, else the sources (`sim.native`).
_native.select()

#: Public name -> (module, attribute), imported lazily.
_LAZY = {
    "run": ("sim.engine.run", "run"),
    "sweep": ("sim.planning", "sweep"),
    "capacity": ("sim.planning.capacity", "capacity"),
    "compare_versions": ("sim.planning.versions", "compare_versions"),
    "RunResult": ("sim.output.results", "RunResult"),
    "load_scenario": ("sim.scenario.schema", "load_scenario"),
    "scenario_from_dict": ("sim.scenario.schema", "scenario_from_dict"),
    "apply_overrides": ("sim.scenario.overrides", "apply_overrides"),
    "derive_num_gpu_blocks": ("sim.memory", "derive_num_gpu_blocks"),
    "get_model": ("sim.catalog", "get_model"),
    "get_gpu": ("sim.catalog", "get_gpu"),
    #: The base class of every bad-input error (a scenario, trace, profile, option, path).
    "InputError": ("sim.errors", "InputError"),
}
_LAZY_MODULES = ("plots", "memory", "catalog")


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        return getattr(importlib.import_module(module_name), attribute)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_LAZY_MODULES})


__all__ = ["__version__", *_LAZY]
