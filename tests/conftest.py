"""Test-wide settings.

Hypothesis: under CI (`CI=true`, as `.ci/run` is run) the examples are derandomized, so a CI
verdict depends only on the commit; locally they stay random (and the example database keeps
what failed), so a developer's runs keep exploring. `HYPOTHESIS_PROFILE=ci` opts in locally.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") == "true" else "dev")
)
