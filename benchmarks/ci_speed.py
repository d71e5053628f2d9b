"""Time the operations the tests check only for correctness, and print a table.

The tests assert what these operations produce, never how long they take (a wall-clock
assertion fails on a slow or busy machine and proves nothing on a fast one). The times live
here instead, with the targets they used to assert:

    python benchmarks/ci_speed.py              # every row
    python benchmarks/ci_speed.py --no-notebook  # skip the notebook (the slowest row)

| row                | what runs                                                | target |
|--------------------|----------------------------------------------------------|--------|
| load azure conv    | `load_azure` of the 19,366-row conversation trace        | < 1 s  |
| fuzz first finding | `kvsim fuzz --design v0-v2` master seed 0 to its finding | < 5 s  |
| fuzz budget 0.2 s  | the budget stops a quiet v1-engine run soon after 0.2 s  | < 5 s  |
| shrink a finding   | `shrink` of that fuzz finding to a 1-minimal reproducer  | < 20 s |
| notebook           | notebooks/capacity_planning.ipynb executed by nbclient   | < 120 s |

Machines are noisy: compare the rows of one run, or runs on one machine.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Imported before any timing: a row times its operation, not pandas' import.
from sim.ci.fuzz import fuzz  # noqa: E402
from sim.ci.shrink import shrink  # noqa: E402
from sim.workload import load_azure  # noqa: E402

AZURE_CONV = ROOT / "sim" / "data" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
NOTEBOOK = ROOT / "notebooks" / "capacity_planning.ipynb"


def timed(action: Callable[[], str]) -> tuple[float, str]:
    start = time.perf_counter()
    detail = action()
    return time.perf_counter() - start, detail


def load_azure_conv() -> str:
    return f"{len(load_azure(AZURE_CONV))} requests"


def fuzz_first_finding() -> str:
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=25)
    finding = report.findings["admission_undercount"]
    return f"case {finding.case_index}, found after {finding.found_after_s:.2f} s"


def fuzz_budget() -> str:
    report = fuzz("v1-engine", master_seed=0, budget_s=0.2)
    return f"{report.num_cases} cases"


def shrink_finding() -> str:
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=25)
    finding = report.findings["admission_undercount"]
    with tempfile.TemporaryDirectory() as out:
        result = shrink(finding.scenario, out, "admission_undercount", "fuzz finding")
    return (
        f"{result.start_num_requests} -> {result.final_num_requests} requests, "
        f"{result.num_runs} runs"
    )


def notebook() -> str:
    import nbclient
    import nbformat

    book = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        book,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    return f"{sum(c.cell_type == 'code' for c in book.cells)} code cells"


ROWS: list[tuple[str, float, Callable[[], str]]] = [
    ("load azure conv", 1.0, load_azure_conv),
    ("fuzz first finding", 5.0, fuzz_first_finding),
    ("fuzz budget 0.2 s", 5.0, fuzz_budget),
    ("shrink a finding", 20.0, shrink_finding),
    ("notebook", 120.0, notebook),
]


def main() -> None:
    skip_notebook = "--no-notebook" in sys.argv[1:]
    header = f"{'row':<20} {'wall s':>8} {'target s':>8}  detail"
    print(header)
    print("-" * len(header))
    for name, target_s, action in ROWS:
        if skip_notebook and name == "notebook":
            continue
        wall_s, detail = timed(action)
        flag = "" if wall_s < target_s else "  (over target)"
        print(f"{name:<20} {wall_s:>8.2f} {target_s:>8.0f}  {detail}{flag}")


if __name__ == "__main__":
    main()
