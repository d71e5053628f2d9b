"""`kvsim verify`: replay random workloads through a kvsim model and vLLM's real code in lockstep.

The lead registers `verify_command` (or the `verify_app` sub-app) on the main CLI. Example::

    kvsim verify --design v0-v2 --vllm-version 0.5.4 --num-ops 10000 --seed 0
    v0-v2 vs vLLM 0.5.4: identical over 10002 operations (69 workloads, ...)
"""

from __future__ import annotations

from pathlib import Path

import typer

verify_app = typer.Typer(help="Compare kvsim's block-manager models with vLLM's real code.")


@verify_app.command("verify")
def verify_command(
    design: str = typer.Option("v0-v2", help="v0-v1, v0-v2 or v1-engine"),
    vllm_root: Path | None = typer.Option(
        None, help="a vLLM install folder (scripts/setup_vllm.sh)"
    ),
    vllm_version: str | None = typer.Option(None, help="a version set up in .vllm/<version>"),
    num_ops: int = typer.Option(10_000, help="operations to compare"),
    seed: int = typer.Option(0, help="seed of the random workloads"),
    ops_per_workload: int = typer.Option(200, help="operations per workload (configuration)"),
    hybrid: bool = typer.Option(
        False, help="v1-engine: draw hybrid configs (full + sliding-window KV-cache groups)"
    ),
) -> None:
    """Report the first divergence, or 'identical over N operations'; exit 1 on a divergence."""
    from sim.vllm_real.lockstep import verify

    # A missing vLLM install (VllmNotAvailableError) is bad input: `sim.cli` prints it, exit 2.
    result = verify(
        vllm_root,
        design,
        num_ops=num_ops,
        seed=seed,
        vllm_version=vllm_version,
        ops_per_workload=ops_per_workload,
        hybrid=hybrid,
    )
    typer.echo(result.summary())
    if not result.identical:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `kvsim verify` to the main CLI."""
    app.command("verify")(verify_command)
