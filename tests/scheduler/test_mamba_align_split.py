"""The block-aligned prefill split of Mamba prefix caching (`sim.scheduler.v1.mamba_align`):
the docstring's worked example under each release's rule, 0.25.1's uncached-prefix cap and
0.26.0's stops, 0.33.0's checkpoint rule, and the scheduler's use of it (a chunk trimmed to 0 is not scheduled). The
comparison with the real schedulers is tests/vllm_real/test_mamba_align_lockstep.py."""

from __future__ import annotations

import pytest

from sim.kv.pins import VllmPin
from sim.scheduler.v1.mamba_align import MambaAlignedSplit, SplitRule, split_rule_for

RULES = [SplitRule.FLOOR, SplitRule.FLOOR_MARCONI, SplitRule.STOPS, SplitRule.CHECKPOINTS]


@pytest.mark.parametrize("rule", RULES)
def test_the_docstring_example(rule):
    """bs=16, a 100-token prompt, budget 40: chunks 32, 32, 32, 4 (states after 32, 64, 96)."""
    split = MambaAlignedSplit(rule, 16, max_prefill_tokens=40)
    chunks, start = [], 0
    while start < 100:
        n = split.split(min(40, 100 - start), start, 100, 100)
        chunks.append(n)
        start += n
    assert chunks == [32, 32, 32, 4]
    assert split.split(8, 0, 100, 100) == 0  # a budget below one block schedules nothing


@pytest.mark.parametrize("rule", RULES)
def test_decode_is_never_split(rule):
    """Past the prompt (start >= max(P, L - 1)) the chunk is left alone."""
    assert MambaAlignedSplit(rule, 16).split(1, 120, 121, 100) == 1


def test_marconi_caps_a_waiting_chunk_at_the_uncached_shared_prefix():
    """0.25.1: full hit 48, Mamba hit 16 -> u = 32: the chunk from 16 stops at 48."""
    marconi = MambaAlignedSplit(SplitRule.FLOOR_MARCONI, 16)
    assert marconi.split(64, 16, 100, 100, uncached_prefix_tokens=32) == 32
    assert (
        MambaAlignedSplit(SplitRule.FLOOR, 16).split(64, 16, 100, 100, uncached_prefix_tokens=32)
        == 64
    )


def test_stops_at_the_junction_and_realigns_a_mid_block_start():
    """0.26.0: the junction J=48 stops a chunk from 0 of 90 tokens (end 80) at 48; a chunk
    starting mid-block (20) stops at the next boundary (32) first."""
    stops = MambaAlignedSplit(SplitRule.STOPS, 16)
    assert stops.split(90, 0, 100, 100, junction_tokens=48) == 48
    assert stops.split(30, 20, 100, 100) == 12
    # 0.19.1 floors the chunk instead, keeping the offset: 20 + 16 = 36.
    assert MambaAlignedSplit(SplitRule.FLOOR, 16).split(30, 20, 100, 100) == 16


def test_rules_by_release():
    assert split_rule_for(VllmPin.V0_19_1) is SplitRule.FLOOR
    assert split_rule_for(VllmPin.V0_20_0) is SplitRule.FLOOR
    assert split_rule_for(VllmPin.V0_25_1) is SplitRule.FLOOR_MARCONI
    assert split_rule_for(VllmPin.V0_26_0) is SplitRule.STOPS
    assert split_rule_for(VllmPin.V0_33_0) is SplitRule.CHECKPOINTS
    assert split_rule_for(VllmPin.V0_11_0) is None


def test_033_with_checkpoint_blocks_lets_the_last_chunk_run_through():
    """0.33.0's docstring example: with checkpoint blocks the chunk from 64 reaching the
    prompt end (checkpoint 96 inside) is 36; without, it stops at 96."""
    with_blocks = MambaAlignedSplit(SplitRule.CHECKPOINTS, 16, 40, checkpoint_blocks=True)
    without = MambaAlignedSplit(SplitRule.CHECKPOINTS, 16, 40)
    assert with_blocks.split(36, 64, 100, 100) == 36
    assert without.split(36, 64, 100, 100) == 32
    assert with_blocks.split(40, 0, 100, 100) == 32  # before the prefill end: floored


def test_033_last_boundary_is_strictly_below_the_length():
    """A block-aligned prompt: 0.26.0's last boundary is L itself (no stop), 0.33.0's L - bs
    (checkpoint 80 for L=96), so its final chunk stops there without checkpoint blocks."""
    assert MambaAlignedSplit(SplitRule.STOPS, 16).split(32, 64, 96, 96) == 32
    assert MambaAlignedSplit(SplitRule.CHECKPOINTS, 16, 40).split(32, 64, 96, 96) == 16


def test_033_a_block_wider_than_the_prefill_limit_advances_sub_block():
    """bs=16 above a 12-token limit: the floor would leave nothing, so the chunk runs 12
    tokens (0.33.0 `L606-616`); with a limit of 16 or more it is floored to 0."""
    assert MambaAlignedSplit(SplitRule.CHECKPOINTS, 16, 12).split(12, 0, 100, 100) == 12
    assert MambaAlignedSplit(SplitRule.CHECKPOINTS, 16, 16).split(12, 0, 100, 100) == 0
