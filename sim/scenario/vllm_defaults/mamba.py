"""The Mamba cache mode each pinned release runs a hybrid (Mamba / linear-attention) model in.

`CacheConfig.mamba_cache_mode` defaults to "none" (`vllm/config/cache.py:L109 (0.19.1)`,
`L304 (0.33.0)`) and `MambaModelConfig.verify_and_update_config` derives it from
`enable_prefix_caching`, which `vllm serve` turns on by default for generative models, hybrids
included (`sim.scenario.vllm_defaults.v1`):

* caching off: "none" (a user's mode is reset, with a warning);
* caching on, 0.19.1-0.26.0 (`model_executor/models/config.py:L436-481 @0.19.1`, `L558-602
  @0.25.1`): a mode left at "none" becomes "all" for models that declare
  `supports_mamba_prefix_caching` (the Mamba2-kernel family: Mamba, Mamba2, Jamba,
  Nemotron-H, Zamba2, Falcon-H1, GraniteMoeHybrid, and Bamba up to 0.25.1) and "align" for
  the others (Qwen3-Next / Qwen3.5 gated-delta-net hybrids, ...); "all" asked of a model
  without that support falls back to "align";
* caching on, 0.33.0 (`L762-787`): "align" (the mode type has no "all", `cache.py:L176`);
* 0.11.0 has no modes: it turns prefix caching off for Mamba models (`L290-297`).

Example: 0.25.1, `vllm serve` of a Nemotron-H checkpoint with no flags -> "all"; of
Qwen3-Next -> "align"; 0.33.0 either -> "align"; `--no-enable-prefix-caching` -> "none".

0.33.0's "align" also has prefill checkpoint blocks where every Mamba layer can export a
state from inside a prefill (`mamba_prefill_checkpoint_blocks`,
`sim.kv.v1_engine.mamba_checkpoint`): Mamba2 layers always
(`model_executor/layers/mamba/mamba_mixer2.py:L1108-1118 @0.33.0`), gated-delta-net layers
with FlashInfer's GDN prefill (`gdn/qwen_gdn_linear_attn.py:L688-698`), which
`_resolve_gdn_prefill_backend` (`L148-230`) picks by default on Hopper, the GPUs kvsim
calibrates; elsewhere Triton's prefill has none (not distinguished here).
"""

from __future__ import annotations

from sim.errors import InputError
from sim.kv.pins import VllmPin
from sim.scenario.vllm_defaults.common import Origin, Setting

#: Releases whose `MambaCacheMode` includes "all".
_HAS_ALL = frozenset({VllmPin.V0_19_1, VllmPin.V0_20_0, VllmPin.V0_25_1, VllmPin.V0_26_0})

_RULE = {
    VllmPin.V0_19_1: "0.19.1 model_executor/models/config.py L436-481",
    VllmPin.V0_20_0: "0.20.0 model_executor/models/config.py L351-405 (speculative decoding: align)",
    VllmPin.V0_25_1: "0.25.1 model_executor/models/config.py L558-602",
    VllmPin.V0_26_0: "0.26.0 model_executor/models/config.py L558-602",
    VllmPin.V0_33_0: "0.33.0 model_executor/models/config.py L762-787",
}


def mamba_prefill_checkpoint_blocks(release: VllmPin, mode: str, state_kind: str | None) -> Setting:
    """The Mamba specs' `num_prefill_checkpoint_blocks` (module docstring): 1 on 0.33.0 in
    "align" for a catalog model (Mamba2 or, on Hopper, gated-delta-net layers), 0 for an
    abstract one (its layers unknown: the scheduler splits as without them) and elsewhere.

    Example: (0.33.0, "align", "mamba2") -> 1; (0.33.0, "align", None) -> 0.
    """
    if not release.mamba_align_has_checkpoints or mode != "align":
        return Setting(0, Origin.RELEASE, "no prefill checkpoint blocks before 0.33.0")
    if state_kind is None:
        return Setting(0, Origin.RELEASE, "model unknown: no prefill checkpoint blocks")
    rule = (
        "0.33.0 mamba_mixer2.py L1108-1118"
        if state_kind == "mamba2"
        else "0.33.0 qwen_gdn_linear_attn.py L688-698 (FlashInfer GDN prefill, Hopper)"
    )
    return Setting(1, Origin.RELEASE, rule)


def resolve_mamba_cache_mode(
    release: VllmPin,
    enable_prefix_caching: bool,
    user_mode: str | None,
    supports_all: bool | None,
) -> Setting:
    """The mode `release` runs (module docstring). `user_mode`: `--mamba-cache-mode` ("none"
    or None: not given); `supports_all`: the model's `supports_mamba_prefix_caching`, None
    when kvsim does not know the architecture (an abstract scenario): then "align", the mode
    of the models kvsim can tell nothing about. Raises `InputError` for "all" on a release
    without it (vLLM's parser refuses the choice).

    Example: (0.25.1, True, None, True) -> "all"; (0.25.1, True, "all", False) -> "align".
    """
    if user_mode not in (None, "none", "align", "all"):
        raise InputError(f"mamba_cache_mode: 'align' or 'all', got {user_mode!r}")
    if user_mode == "all" and release not in _HAS_ALL:
        raise InputError(
            f"mamba_cache_mode: vLLM {release.value} has no 'all' mode (0.19.1-0.26.0 do)"
        )
    rule = _RULE.get(release, "0.11.0 model_executor/models/config.py L290-297 (caching off)")
    if not enable_prefix_caching or release not in _RULE:
        return Setting("none", Origin.RELEASE, rule)
    if user_mode in ("align", "all"):
        if user_mode == "all" and supports_all is False:
            return Setting("align", Origin.RELEASE, rule + ": 'all' unsupported, falls back")
        return Setting(user_mode, Origin.USER, "set by the user")
    if release in _HAS_ALL and supports_all:
        return Setting("all", Origin.RELEASE, rule + ": supports_mamba_prefix_caching")
    if release in _HAS_ALL and supports_all is None:
        return Setting(
            "align",
            Origin.RELEASE,
            rule + ": model unknown, so 'align' (Mamba2-family models would run 'all')",
        )
    return Setting("align", Origin.RELEASE, rule)
