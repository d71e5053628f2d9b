"""`kvsim verify`: replay random workloads through a kvsim model and vLLM's real code in lockstep.

The lead registers `verify_command` (or the `verify_app` sub-app) on the main CLI. Example::

    kvsim verify --design v0-v2 --vllm-version 0.5.4 --num-ops 10000 --seed 0
    v0-v2 vs vLLM 0.5.4: identical over 10002 operations (69 workloads, ...)

    kvsim verify --scheduler --num-workloads 60     # V1 Scheduler, step by step, vs vLLM 0.11.0
    v1-engine @0.11.0 scheduler vs vLLM 0.11.0: identical over 60 workloads (...)
    v1-engine @4ac7713 scheduler vs vLLM 0.11.0: identical over 60 workloads (...)
    kvsim verify --scheduler --trace sim/data/traces/mooncake_fast25/conversation_trace.jsonl
    kvsim verify --scheduler --vllm-version 0.33.0  # kvsim's 0.33.0 pin (setup_vllm.sh 0.33.0)
    kvsim verify --scheduler --async --vllm-version 0.33.0  # AsyncScheduler + the batch queue
    kvsim verify --scheduler --design v0-v1 --vllm-version 0.5.4  # the v0 Scheduler vs 0.5.4's
    kvsim verify --defaults --vllm-version 0.33.0   # the release's resolved engine settings
    defaults vs vLLM 0.33.0: 1260 of 1260 configurations identical (112 refused by both)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sim.vllm_real.loader import VllmInstall

verify_app = typer.Typer(help="Compare kvsim's block-manager models with vLLM's real code.")


@verify_app.command("verify")
def verify_command(
    design: str = typer.Option(
        "v0-v2",
        help="v0-v1, v0-v2 or v1-engine (with --scheduler: v1-engine, or v0-v1 / v0-v2 with "
        "--vllm-version 0.5.4 for the v0 scheduler)",
    ),
    vllm_root: Path | None = typer.Option(
        None, help="a vLLM install folder (scripts/setup_vllm.sh)"
    ),
    vllm_version: str | None = typer.Option(None, help="a version set up in .vllm/<version>"),
    num_ops: int | None = typer.Option(None, help="operations to compare (default 10000)"),
    seed: int = typer.Option(0, help="seed of the random workloads"),
    ops_per_workload: int | None = typer.Option(
        None, help="operations per workload (configuration; default 200)"
    ),
    scheduler: bool = typer.Option(
        False,
        "--scheduler",
        help="compare the V1 Scheduler step by step (vLLM >= 0.10) instead of the managers",
    ),
    num_workloads: int | None = typer.Option(
        None, help="with --scheduler: random workloads to compare (default 60)"
    ),
    trace: Path | None = typer.Option(
        None,
        help="with --scheduler: compare --num-workloads windows of this trace (e.g. the bundled "
        "sim/data/traces/mooncake_fast25/conversation_trace.jsonl), scaled down, instead of "
        "random workloads",
    ),
    fast_path: bool = typer.Option(
        False,
        "--fast-path",
        help="with --scheduler: run kvsim's decode fast path and cohort, as `kvsim run` does",
    ),
    async_scheduling: bool = typer.Option(
        False,
        "--async",
        help="with --scheduler: both run async scheduling (AsyncScheduler behind the engine "
        "core's batch queue of 2), compared call for call",
    ),
    pin: list[str] | None = typer.Option(
        None,
        help="with --scheduler: kvsim's V1 pin(s) to compare (default: the loaded version's, "
        "0.11.0 and 4ac7713 for vLLM 0.10/0.11, which decide alike)",
    ),
    hybrid: bool = typer.Option(
        False,
        help="v1-engine: draw hybrid configs (full + sliding-window KV-cache groups; with "
        "--scheduler: Mamba hybrids in half the workloads, on pins from 0.11.0)",
    ),
    mamba_caching: bool = typer.Option(
        False,
        "--mamba-caching",
        help="with --scheduler: draw full + Mamba hybrids with prefix caching (Mamba cache mode "
        "'align'; pins 0.19.1-0.33.0) instead of plain workloads",
    ),
    defaults: bool = typer.Option(
        False,
        "--defaults",
        help="compare the engine settings the release resolves (EngineArgs -> "
        "create_engine_config) with sim.scenario.vllm_defaults over a grid of deployments",
    ),
    num_configs: int | None = typer.Option(
        None, help="with --defaults: deployments to compare (default: the whole grid, ~1200)"
    ),
) -> None:
    """Report the first divergence, or 'identical over N operations'; exit 1 on a divergence."""
    others = {"--num-ops": num_ops, "--ops-per-workload": ops_per_workload, "--hybrid": hybrid,
              "--num-workloads": num_workloads, "--trace": trace, "--fast-path": fast_path,
              "--pin": pin, "--scheduler": scheduler, "--async": async_scheduling,
              "--mamba-caching": mamba_caching}  # fmt: skip
    if defaults or num_configs is not None:
        _verify_defaults(vllm_root, vllm_version, num_configs, defaults, others)
        return
    _check_options(
        scheduler,
        {"--num-ops": num_ops, "--ops-per-workload": ops_per_workload},
        {
            "--num-workloads": num_workloads,
            "--trace": trace,
            "--fast-path": fast_path,
            "--pin": pin,
            "--async": async_scheduling,
            "--mamba-caching": mamba_caching,
        },
    )
    from sim.errors import InputError

    # Input errors first: the vLLM-install check below must not hide them behind "not installed".
    if not scheduler and design == "v0-fixed":
        raise InputError(
            "--design v0-fixed has no vLLM counterpart (it is kvsim's own fix of v0-v2), so "
            "it is not verifiable; verify v0-v1, v0-v2 or v1-engine"
        )
    if vllm_root is None and vllm_version is not None:
        _check_pinned(vllm_version)
    if scheduler:
        _verify_scheduler(
            design,
            vllm_root,
            vllm_version,
            num_workloads or 60,
            seed,
            pin,
            fast_path,
            trace,
            async_scheduling,
            hybrid,
            mamba_caching,
        )
        return
    from sim.vllm_real.lockstep import verify

    # A missing vLLM install (VllmNotAvailableError) is bad input: `sim.cli.main` prints it, exit 2.
    result = verify(
        vllm_root,
        design,
        num_ops=10_000 if num_ops is None else num_ops,
        seed=seed,
        vllm_version=vllm_version,
        ops_per_workload=200 if ops_per_workload is None else ops_per_workload,
        hybrid=hybrid,
    )
    typer.echo(result.summary())
    if not result.identical:
        raise typer.Exit(1)


def _verify_defaults(
    vllm_root: Path | None,
    vllm_version: str | None,
    num_configs: int | None,
    defaults: bool,
    others: dict,
) -> None:
    """`--defaults`: the release's resolved settings vs `sim.scenario.vllm_defaults`."""
    from sim.errors import InputError
    from sim.vllm_real.defaults_lockstep import verify_defaults

    if not defaults:
        raise InputError("--num-configs is for --defaults; without it it would do nothing")
    for name, value in others.items():
        if value not in (None, False, []):
            raise InputError(f"{name} is not for --defaults; with it it would do nothing")
    if num_configs is not None and num_configs < 1:
        raise InputError(f"--num-configs {num_configs}: must be at least 1")
    result = verify_defaults(vllm_version or "0.33.0", num_configs, vllm_root=vllm_root)
    typer.echo(result.summary())
    if not result.all_identical:
        raise typer.Exit(1)


def _check_pinned(version: str) -> None:
    """`--vllm-version` names a release kvsim pins, or one the user has installed anyway (an
    install of another release still runs, comparing shapes only); else say it is no pin."""
    from sim.errors import InputError
    from sim.vllm_real.loader import VllmNotAvailableError, resolve_root
    from sim.vllm_real.lockstep import PINNED_RELEASES

    if any(version in pins for pins in PINNED_RELEASES.values()):
        return  # a pin: a missing install is reported by the loader, with what to run
    try:
        resolve_root(None, version)
    except VllmNotAvailableError:
        pins = "; ".join(f"{', '.join(v)} for {d}" for d, v in PINNED_RELEASES.items())
        raise InputError(
            f"--vllm-version {version}: {version} is not a release kvsim pins (pinned: {pins}); "
            "give --vllm-root to compare with an install of another release"
        ) from None


def _check_options(scheduler: bool, managers: dict, schedulers: dict) -> None:
    """Refuse, before the vLLM install is looked for, an option that would do nothing: one of
    the other mode's (`managers` without --scheduler, `schedulers` with it: given means not
    None/False/empty), or a count below 1 (a gate "identical over 0 operations" is no gate).

    Regression: `kvsim verify --num-ops 0` printed "identical over 0 operations", exit 0."""
    from sim.errors import InputError

    for name, value in (*managers.items(), *schedulers.items()):
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise InputError(f"{name} {value}: must be at least 1")
    ignored, mode = (managers, "--scheduler") if scheduler else (schedulers, "no --scheduler")
    for name, value in ignored.items():
        if value not in (None, False, []):
            what = "the block managers" if scheduler else "the V1 Scheduler (--scheduler)"
            raise InputError(f"{name} is for {what}; with {mode} it would do nothing")


def _verify_scheduler(
    design: str,
    vllm_root: Path | None,
    vllm_version: str | None,
    num_workloads: int,
    seed: int,
    pins: list[str] | None,
    fast_path: bool,
    trace: Path | None,
    async_scheduling: bool = False,
    hybrid: bool = False,
    mamba_caching: bool = False,
) -> None:
    """`--scheduler`: kvsim's V1 scheduler against the installed vLLM's, pin by pin (a v0
    design: `_verify_v0_scheduler`); exit 1 when any pin diverges."""
    from sim.vllm_real.loader import version_tuple
    from sim.vllm_real.sched_lockstep import verify_scheduler

    v0_release = vllm_version is not None and version_tuple(vllm_version) < (0, 10)
    if design == "v0-v1" or (design == "v0-v2" and v0_release):
        v1_only = {"--trace": trace is not None, "--pin": bool(pins), "--async": async_scheduling,
                   "--hybrid": hybrid, "--mamba-caching": mamba_caching}  # fmt: skip
        _refuse_given(v1_only, f"is for the V1 scheduler; --design {design} has none")
        _verify_v0_scheduler(design, vllm_root, vllm_version, num_workloads, seed, fast_path)
        return
    _check_v1_scheduler_options(design, num_workloads, pins, trace, hybrid, mamba_caching)
    workloads = None
    if trace is not None:  # a missing or malformed trace is bad input (WorkloadError)
        from sim.vllm_real.sched_traces import trace_windows

        workloads = trace_windows(num_workloads, seed, trace)
    install = _v1_install(vllm_root, vllm_version)
    diverged = False
    for one in _pins_to_verify(pins, install, mamba_caching):
        result = verify_scheduler(
            num_workloads,
            seed,
            pin=one,
            install=install,
            fast_path=fast_path,
            workloads=workloads,
            async_scheduling=async_scheduling,
            hybrid=hybrid,
            mamba_align=mamba_caching,
        )
        typer.echo(result.summary())
        diverged = diverged or not result.identical
    if diverged:
        raise typer.Exit(1)


def _refuse_given(options: dict[str, bool], why: str) -> None:
    """Refuse the first of `options` given (True), naming it: "--pin {why}"."""
    from sim.errors import InputError

    for name, given in options.items():
        if given:
            raise InputError(f"{name} {why}")


def _check_v1_scheduler_options(
    design: str,
    num_workloads: int,
    pins: list[str] | None,
    trace: Path | None,
    hybrid: bool,
    mamba_caching: bool,
) -> None:
    """Refuse, before the vLLM install is looked for, a design without a V1 scheduler, an
    unknown pin, or options that exclude each other (`--trace` with a drawn workload kind)."""
    from sim.errors import InputError
    from sim.kv.config import Design
    from sim.kv.pins import resolve_pin

    if design not in ("v0-v2", "v1-engine"):  # v0-v2 is the managers' default, not a choice
        raise InputError(
            f"--scheduler compares the V1 engine, or with --design v0-v1 / v0-v2 --vllm-version "
            f"0.5.4 the v0 scheduler; --design {design!r} has no vLLM scheduler"
        )
    if num_workloads <= 0:
        raise InputError(f"--num-workloads must be positive, got {num_workloads}")
    for one in pins or ():
        try:
            resolve_pin(Design.V1_ENGINE, one)
        except ValueError as exc:  # an unknown pin is bad input
            raise InputError(f"--pin: {exc}") from None
    if trace is not None:
        _refuse_given({"--hybrid": hybrid, "--mamba-caching": mamba_caching},
                      "draws random workloads; with --trace it would do nothing")  # fmt: skip
    if hybrid and mamba_caching:
        raise InputError("--mamba-caching draws its own hybrids; with --hybrid give one of them")


def _v1_install(vllm_root: Path | None, vllm_version: str | None) -> VllmInstall:
    """The vLLM install to compare with (0.11.0 by default). A missing or pre-V1 install is bad
    input (VllmNotAvailableError / InputError: exit 2)."""
    from sim.errors import InputError
    from sim.vllm_real.loader import load_vllm

    install = load_vllm(vllm_root, None if vllm_root else (vllm_version or "0.11.0"))
    if install.version_tuple < (0, 10):
        raise InputError(f"--scheduler needs vLLM >= 0.10 (the V1 engine), got {install.version}")
    return install


def _pins_to_verify(
    pins: list[str] | None, install: VllmInstall, mamba_caching: bool
) -> Iterator[str]:
    """The pins to compare, one at a time: those given, else the install's own, else every pin
    matching 0.11.0. With `--mamba-caching`, a pin that models no Mamba prefix caching is
    refused when its turn comes (the pins before it have run)."""
    from sim.errors import InputError
    from sim.kv.config import Design
    from sim.kv.pins import resolve_pin
    from sim.vllm_real.lockstep import v1_pin_for
    from sim.vllm_real.sched_lockstep import PINS_MATCHING_0_11_0

    loaded_pin = v1_pin_for(install.version_tuple)
    for one in pins or ((loaded_pin,) if loaded_pin else PINS_MATCHING_0_11_0):
        if mamba_caching and not resolve_pin(Design.V1_ENGINE, one).models_mamba_align:
            raise InputError(
                f"--mamba-caching: pin {one} has no Mamba prefix caching kvsim models "
                "(0.19.1, 0.20.0, 0.25.1, 0.26.0 and 0.33.0 have)"
            )
        yield one


def _verify_v0_scheduler(
    design: str,
    vllm_root: Path | None,
    vllm_version: str | None,
    num_workloads: int,
    seed: int,
    fast_path: bool,
) -> None:
    """`--scheduler --design v0-v1|v0-v2 [--vllm-version 0.5.4]`: kvsim's v0 scheduler against
    vLLM 0.5.4's (`sim.vllm_real.v0_sched_lockstep`) over random workloads of that design's
    block manager."""
    from sim.errors import InputError
    from sim.vllm_real.loader import load_vllm
    from sim.vllm_real.v0_sched_lockstep import verify_v0_scheduler

    if num_workloads <= 0:
        raise InputError(f"--num-workloads must be positive, got {num_workloads}")
    install = load_vllm(vllm_root, None if vllm_root else (vllm_version or "0.5.4"))
    if install.version_tuple[:2] != (0, 5):
        raise InputError(f"--scheduler --design {design} needs vLLM 0.5.x, got {install.version}")
    kind = "v1" if design == "v0-v1" else "v2"
    result = verify_v0_scheduler(
        num_workloads, seed, kinds=(kind,), install=install, fast_path=fast_path
    )
    typer.echo(result.summary())
    if not result.identical:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `kvsim verify` to the main CLI."""
    app.command("verify")(verify_command)
