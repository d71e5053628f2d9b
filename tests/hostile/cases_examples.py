"""Class 8, the shipped examples: every quick bundled scenario passes its own `expect:`.

`kvsim check` on each scenario in scenarios/ (but the whole-trace Azure replay, ~30 s) and on
the built-in default; the `scenario.yaml` that `kvsim run` writes passes `kvsim check` too (the
default's `expect:` once listed kinds its 1,500 requests do not show); each cluster feature
(prefix-cache-aware routing, CPU offload, P/D disaggregation, sessions) has a bundled scenario
whose `expect.summary` states what it shows; and those bounds do fail when the effect is gone.
"""

from __future__ import annotations

from pathlib import Path

from tests.hostile import harness
from tests.hostile.harness import ROOT, Case, tiny

SCENARIOS = ROOT / "scenarios"
DEFAULT = ROOT / "sim" / "data" / "scenarios" / "default.yaml"
#: Bundled scenarios too slow for this suite (tests/docs/test_readme_findings.py covers them).
SLOW = {"mistral_azure_conv_swa.yaml"}


def _ran(argv: list[str]):
    """A setup that runs `kvsim ARGV` in the case's folder first (its outputs are the inputs
    of the case's own command); a failure fails the setup, loudly."""

    def setup(folder: Path) -> None:
        answer = harness.run_in_process(argv, folder)
        assert answer.exit == 0, answer.output

    return setup


def _without(path: Path, old: str, new: str) -> str:
    """A bundled scenario's text with `old` replaced (made absolute-path safe by the caller)."""
    text = path.read_text()
    assert old in text, (path, old)
    return text.replace(old, new)


def _cases() -> list[Case]:
    cases: list[Case] = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        if path.name in SLOW:
            continue
        cases.append(
            Case("examples", ("check", str(path)), 0, "1 passed", name=f"check {path.name}")
        )
    cases.append(Case("examples", ("check", str(DEFAULT)), 0, "1 passed", name="check default"))
    run_dir = "runs/default-mistral-azure-conv-v0-v2"
    cases.append(
        Case(
            "examples",
            ("check", f"{run_dir}/scenario.yaml"),
            0,
            "1 passed",
            setup=_ran(["run", "--no-plots"]),
            name="the default's expect matches its own 1,500 requests (run, then check)",
        )
    )
    for scenario, name in (
        ("swa_4_vs_3_v0_v2.yaml", "swa-4-vs-3-v0-v2"),
        ("sessions_chat_v1.yaml", "sessions-chat-v1-engine"),
        ("cpu_offload_sessions_v1.yaml", "cpu-offload-sessions-v1-engine"),
    ):
        cases.append(
            Case(
                "examples",
                ("check", f"runs/{name}/scenario.yaml"),
                0,
                "1 passed",
                setup=_ran(["run", str(SCENARIOS / scenario), "--no-plots"]),
                name=f"run {scenario}, then check the scenario.yaml it wrote",
            )
        )
    # The bounds fail when the effect is gone: the offload scenario without its CPU tier, the
    # routing one under round robin.
    offload = SCENARIOS / "cpu_offload_sessions_v1.yaml"
    cases.append(
        Case(
            "examples",
            ("check", "s.yaml"),
            1,
            "ttft_p50_s 1.295 is above max 1",
            files={"s.yaml": _without(offload, "cpu_offload_gib: 16", "cpu_offload_gib: 0")},
            name="cpu offload: without the CPU tier its expect.summary fails",
        )
    )
    routing = SCENARIOS / "prefix_aware_routing_sessions_v1.yaml"
    cases.append(
        Case(
            "examples",
            ("check", "s.yaml"),
            1,
            "is below min 0.8",
            files={
                "s.yaml": _without(routing, "router: prefix_cache_aware", "router: round_robin")
            },
            name="prefix-aware routing: under round robin its expect.summary fails",
        )
    )
    with_summary = tiny().replace(
        "expect: {violations: none}", "expect: {violations: none, summary: {SUMMARY}}"
    )
    for summary, exit_code, fragment, label in (
        ("ttft_p50_s: {max: 10}", 0, "1 passed", "a bound met"),
        ("num_preemptions: {min: 1}", 1, "num_preemptions 0 is below min 1", "a bound missed"),
        ("bogus_metric: {max: 1}", 2, "s.yaml: expect.summary.bogus_metric", "an unknown metric"),
        ("states: {max: 1}", 2, "expect.summary.states: {", "a section, not a number"),
        ("ttft_p50_s: {}", 2, "give min, max or both", "a bound with no limit"),
        ("ttft_p50_s: {min: 2, max: 1}", 2, "min 2.0 is above max 1.0", "min above max"),
        ("ttft_p50_s: {max: .inf}", 2, "expect.summary.ttft_p50_s.max", "an infinite bound"),
    ):
        cases.append(
            Case(
                "examples",
                ("check", "s.yaml"),
                exit_code,
                fragment,
                files={"s.yaml": with_summary.replace("SUMMARY", summary)},
                name=f"expect.summary: {label}",
            )
        )
    return cases


CASES: list[Case] = _cases()
