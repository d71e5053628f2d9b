"""Reports of `kvsim check` that CI systems read: JUnit XML and GitHub Actions annotations.

JUnit: one `<testsuite name="kvsim check">`, one `<testcase>` per scenario
(`classname` = "kvsim.<scenario folder>", `name` = scenario name, `file` = its path). A failed
expectation is a `<failure>` whose `message` is one line and whose text holds the first
violation of each kind and the command that reproduces it locally; an invalid scenario file
(type `BadInput`) or a simulator crash (`SimulatorError`) is an `<error>`. The layout is the
Jenkins/Surefire one that GitLab, Jenkins, Azure Pipelines and the GitHub test-report actions
display.

GitHub Actions (when `GITHUB_ACTIONS=true`): one workflow command per failed scenario::

    ::error file=scenarios/x.yaml,title=kvsim check: swa-4-vs-3::swa-4-vs-3: unexpected ...

Data is escaped as the runner expects: `%` -> `%25`, CR -> `%0D`, LF -> `%0A`; property
values (file, title) also escape `:` -> `%3A` and `,` -> `%2C`.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

from sim.ci.outcome import CheckOutcome, display_path


def _classname(outcome: CheckOutcome) -> str:
    folder = Path(display_path(outcome.path)).parent.as_posix().strip("./") or "scenarios"
    return "kvsim." + folder.replace("/", ".")


def junit_xml(outcomes: list[CheckOutcome], suite_name: str = "kvsim check") -> str:
    """The JUnit XML document (a string with an XML declaration) for `outcomes`."""
    num_errors = sum(o.crashed or o.bad_input for o in outcomes)
    num_failures = sum(not o.passed for o in outcomes) - num_errors
    total_s = sum(o.duration_s for o in outcomes)
    root = ET.Element("testsuites", name=suite_name, tests=str(len(outcomes)))
    root.set("failures", str(num_failures))
    root.set("errors", str(num_errors))
    root.set("time", f"{total_s:.3f}")
    suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(outcomes)))
    suite.set("failures", str(num_failures))
    suite.set("errors", str(num_errors))
    suite.set("skipped", "0")
    suite.set("time", f"{total_s:.3f}")
    for outcome in outcomes:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=_classname(outcome),
            name=outcome.name,
            file=display_path(outcome.path),
            time=f"{outcome.duration_s:.3f}",
        )
        if not outcome.passed:
            # JUnit: <failure> is a failed assertion, <error> a test that could not run as
            # meant: the simulator crashed, or the scenario (or its trace) is invalid.
            if outcome.bad_input:
                tag, kind = "error", "BadInput"
            elif outcome.crashed:
                tag, kind = "error", "SimulatorError"
            else:
                tag, kind = "failure", "ExpectationFailed"
            failure = ET.SubElement(case, tag, message=outcome.one_line(), type=kind)
            failure.text = outcome.failure_text()
        out = ET.SubElement(case, "system-out")
        out.text = (
            f"design={outcome.design} vllm_version={outcome.vllm_version or '-'} "
            f"seed={outcome.seed} expected={outcome.expected} "
            f"observed={outcome.observed_kinds or 'none'} requests={outcome.num_requests}\n"
            f"reproduce: {outcome.reproduce_command}"
        )
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(outcome: CheckOutcome) -> str:
    """The `::error ...::` workflow command for a failed scenario (multi-line message escaped)."""
    file = _escape_property(display_path(outcome.path))
    title = _escape_property(f"kvsim check: {outcome.name}")
    return f"::error file={file},title={title}::{_escape_data(outcome.failure_text())}"


def in_github_actions(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get("GITHUB_ACTIONS", "").lower() == "true"


def github_annotations(outcomes: list[CheckOutcome]) -> list[str]:
    return [github_annotation(o) for o in outcomes if not o.passed]
