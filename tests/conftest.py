"""Test-wide settings.

Hypothesis: under CI (`CI=true`, as `.ci/run` is run) the examples are derandomized, so a CI
verdict depends only on the commit; locally they stay random (and the example database keeps
what failed), so a developer's runs keep exploring. `HYPOTHESIS_PROFILE=ci` opts in locally.
Neither profile has a deadline (see below).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# No per-example deadline in either profile, and no "too slow to generate" check in CI: both are
# wall-clock assertions, and on a loaded 2-core CI runner they would fail for the machine, not
# the code.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") == "true" else "dev")
)


def pytest_sessionfinish(session, exitstatus):
    """Stop this process's lockstep zygotes (`tests.harness.zygote`) and wait for them, here
    rather than at interpreter exit: an xdist worker may end without running atexit hooks,
    and a zygote no one waits for would outlive the run (and its CPU time go uncounted)."""
    import sys

    module = sys.modules.get("tests.harness.zygote")
    if module is not None:
        module.stop_all()
