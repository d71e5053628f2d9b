"""The vLLM v0 code each v0 design models, and how a scenario names it (`scheduler.vllm_version`).

Read against the real sources (the 0.5.4 wheel, release commit 4db5176 of 2024-08-05, and upstream
main at 00c3d68 of 2024-08-13 / fc93e56 of 2024-08-15, `git diff 4db5176 fc93e56 -- vllm/core`):

==========================  =================================  ==============================
behaviour                   0.5.4 release (4db5176)            00c3d68 / fc93e56
==========================  =================================  ==============================
empty append, full table    IndexError (#7371)                 returns (#7380)
evictor_v2 victim scan      every entry, `update` stays put    stops at a later time (#7193)
prefix-caching touched cnt  cached full block counts 0         counts 1 if in evictor (#6849)
block_manager_v1            --                                 same decisions (refactor only)
==========================  =================================  ==============================

kvsim models the release's evictor and touched count (the manager lockstep drives the real 0.5.4
wheel against them), and the empty append both ways. So there are two v0 versions, and only the
first is a vLLM version exactly:

* ``"0.5.4"``: the release, what `--vllm-root .vllm/0.5.4` runs. The default, so that model and
  real code agree when nothing is named.
* ``"0.5.4+7380"``: the release plus PR #7380, which is what kvsim's v0-V2 block table followed
  when it was said to follow "00c3d68". It is *not* 00c3d68: that commit also has #7193 and #6849,
  which kvsim does not model.

BlockSpaceManagerV1 makes the same decisions at the release and at fc93e56, so v0-v1 has the one
version "0.5.4". v0-fixed is kvsim's own design over the release's V2 code; its table writes
nothing on an empty append (it fixes #7371 itself), so it too has the one version "0.5.4".
"""

from __future__ import annotations

import enum


class V0Version(enum.Enum):
    """A vLLM v0 code base a v0 design follows."""

    #: The vLLM 0.5.4 wheel (release commit 4db5176, 2024-08-05).
    RELEASE_0_5_4 = "0.5.4"
    #: The 0.5.4 release with PR #7380 (no IndexError on an empty append), nothing else.
    RELEASE_0_5_4_PR_7380 = "0.5.4+7380"

    @property
    def empty_append_raises(self) -> bool:
        """Whether an empty append to a full v0-V2 block table raises (#7371)."""
        return self is V0Version.RELEASE_0_5_4

    @property
    def words(self) -> str:
        """How reports name it: 'vLLM 0.5.4' or 'vLLM 0.5.4 + #7380'."""
        if self is V0Version.RELEASE_0_5_4:
            return "vLLM 0.5.4"
        return "vLLM 0.5.4 + #7380"


#: What a scenario that names no version gets: the release the real-code mode runs.
DEFAULT_V0 = V0Version.RELEASE_0_5_4

#: The versions each v0 design can be pinned to (design value -> versions, default first).
V0_VERSIONS_BY_DESIGN: dict[str, tuple[V0Version, ...]] = {
    "v0-v1": (V0Version.RELEASE_0_5_4,),
    "v0-v2": (V0Version.RELEASE_0_5_4, V0Version.RELEASE_0_5_4_PR_7380),
    "v0-fixed": (V0Version.RELEASE_0_5_4,),
}


def resolve_v0_version(design: str, pin: str | None) -> V0Version:
    """The version `pin` names for the v0 `design`; None gives `DEFAULT_V0`.

    Example: ``resolve_v0_version("v0-v2", "0.5.4+7380")`` -> `RELEASE_0_5_4_PR_7380`;
    ``resolve_v0_version("v0-v1", "0.5.4+7380")`` raises ValueError (v0-v1 has one version).
    """
    allowed = V0_VERSIONS_BY_DESIGN[design]
    if pin is None:
        return DEFAULT_V0
    for version in allowed:
        if version.value == pin:
            return version
    names = ", ".join(version.value for version in allowed)
    raise ValueError(f"unknown vLLM version {pin!r} for {design}; pinned: {names}")
