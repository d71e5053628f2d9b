"""kvsim: a discrete-event simulator of an LLM-serving engine's scheduler and paged KV cache.

`import sim` never imports torch; kernel timing lives in the separate `calibrate` package.

Public API, imported lazily on first use (so `import sim` stays cheap)::

    result = sim.run("scenario.yaml")                     # RunResult (DataFrames + summary)
    table  = sim.sweep("scenario.yaml", {"workload.rate_scale": [1, 2, 4]})   # DataFrame
    cap    = sim.capacity("scenario.yaml", ["ttft_p99=2s"], target_rate=50)  # DataFrame

`sim.run` and `sim.sweep` are also the names of subpackages (`sim/run.py`, `sim/sweep/`).
Importing a submodule makes it the package attribute, which would hide a function of the same
name; so those two modules are made callable instead: `sim.run(...)` calls `sim.run.run(...)`
and `sim.sweep(...)` calls `sim.sweep.sweep(...)`, while `sim.run.resolve` etc. keep working.
"""

from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

#: Submodules whose same-named function the module itself calls.
_CALLABLE_MODULES = ("run", "sweep")
#: name -> (module, attribute) for plain lazy exports.
_LAZY = {
    "capacity": ("sim.sweep.capacity", "capacity"),
    "RunResult": ("sim.results", "RunResult"),
    "load_scenario": ("sim.scenario", "load_scenario"),
    "scenario_from_dict": ("sim.scenario", "scenario_from_dict"),
    "apply_overrides": ("sim.overrides", "apply_overrides"),
    "derive_num_gpu_blocks": ("sim.memory", "derive_num_gpu_blocks"),
    "get_model": ("sim.catalog", "get_model"),
    "get_gpu": ("sim.catalog", "get_gpu"),
}
_LAZY_MODULES = ("plots", "memory", "catalog")


class _CallableModule(types.ModuleType):
    """A module that, called, calls its function of the same name (`sim.run(...)`)."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # The import system sets `sim.run = <module sim.run>` after importing it: make it callable.
        if name in _CALLABLE_MODULES and type(value) is types.ModuleType:
            value.__class__ = _CallableModule
        super().__setattr__(name, value)


def __getattr__(name: str):
    if name in _CALLABLE_MODULES or name in _LAZY_MODULES:
        importlib.import_module(f"{__name__}.{name}")
        return sys.modules[__name__].__dict__[name]
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        return getattr(importlib.import_module(module_name), attribute)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_CALLABLE_MODULES, *_LAZY, *_LAZY_MODULES})


sys.modules[__name__].__class__ = _Package
__all__ = ["__version__", "capacity", "run", "sweep"]
