"""Which all-reduce vLLM picks per message and what kvsim charges for it (sim.latency.allreduce).

Every threshold below is read from the upstream lines the module docstring cites (0.11.0 and
0.33.0 wheels: custom_all_reduce.py, all_reduce_utils.py, symm_mem.py, cuda_communicator.py,
flashinfer_all_reduce.py, allreduce_rms_fusion.py; csrc/custom_all_reduce.cuh for one-/two-shot).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.latency import BatchShape, make_step_time
from sim.latency import allreduce as ar
from sim.latency.allreduce import Algorithm, Link, algorithm
from sim.latency.interconnect import host_staged_allreduce
from sim.latency.measured import MeasuredStepTime
from sim.scenario.resolve import step_time_model
from sim.scenario.schema import scenario_from_dict

KiB, MiB = 1024, 1024 * 1024
H100, A100 = Link.of("h100-sxm"), Link.of("a100-80gb-sxm")
ONE, TWO = Algorithm.CUSTOM_ONE_SHOT, Algorithm.CUSTOM_TWO_SHOT
FI, SYMM, NCCL = Algorithm.FLASHINFER, Algorithm.TORCH_SYMM_MEM, Algorithm.NCCL

# (link, tp, bytes, expected) per release; each row at or next to a cited threshold.
DISPATCH_0_11_0 = [
    # H100 TP 2: custom below min(64 MiB, 8 MiB buffer), symmetric memory below 64 MiB
    (H100, 2, 8 * MiB - 16, ONE),
    (H100, 2, 8 * MiB, SYMM),
    (H100, 2, 64 * MiB - 16, SYMM),
    (H100, 2, 64 * MiB, NCCL),
    # H100 TP 4: one-shot below 512 KiB (REDUCE_CASE), two-shot to 8 MiB, symm to 32 MiB
    (H100, 4, 16 * KiB, ONE),
    (H100, 4, 512 * KiB - 16, ONE),
    (H100, 4, 512 * KiB, TWO),
    (H100, 4, 8 * MiB - 16, TWO),
    (H100, 4, 8 * MiB, SYMM),
    (H100, 4, 32 * MiB, NCCL),
    # H100 TP 6: custom cap 512 KiB; one-shot below 256 KiB (tp <= 8 rule)
    (H100, 6, 256 * KiB - 16, ONE),
    (H100, 6, 256 * KiB, TWO),
    (H100, 6, 512 * KiB, SYMM),
    (H100, 6, 64 * MiB, NCCL),
    # H100 TP 8: custom cap 256 KiB
    (H100, 8, 256 * KiB - 16, ONE),
    (H100, 8, 256 * KiB, SYMM),
    # A100 (SM 8.0): no symmetric memory, so the 8 MiB buffer is the custom cap
    (A100, 2, 8 * MiB - 16, ONE),
    (A100, 2, 8 * MiB, NCCL),
    (A100, 4, 512 * KiB, TWO),
    (A100, 4, 8 * MiB, NCCL),
    # PCIe with P2P: custom at TP 2 only (custom_all_reduce.py L141-148)
    (Link.of("l40s"), 2, 16 * KiB, ONE),
    (Link.of("l40s"), 4, 16 * KiB, NCCL),
    (Link.of("h100-pcie"), 2, 16 * MiB, NCCL),  # no NVSwitch multicast: symm off, cap 8 MiB
    (Link.of("h100-pcie"), 4, 16 * KiB, NCCL),
    # TP 3 is not a supported world size; an unknown GPU has no capability
    (H100, 3, 16 * KiB, NCCL),
    (Link.of("mi300x"), 2, 16 * KiB, NCCL),
]
DISPATCH_0_33_0 = [
    # FlashInfer first, up to FI_ALLREDUCE_FUSION_MAX_SIZE_MB inclusive
    (H100, 2, 16 * KiB, FI),
    (H100, 2, 64 * MiB, FI),
    (H100, 2, 64 * MiB + 16, NCCL),
    (H100, 4, 2 * MiB, FI),
    (H100, 4, 2 * MiB + 16, TWO),
    (H100, 4, 8 * MiB, SYMM),
    (H100, 4, 32 * MiB, NCCL),
    (H100, 8, MiB // 2, FI),
    (H100, 8, MiB // 2 + 16, SYMM),
    (H100, 6, 16 * KiB, ONE),  # no FlashInfer entry at TP 6
    (Link.of("h100-pcie"), 2, 16 * KiB, FI),
    (Link.of("b200"), 4, 32 * MiB, FI),
    (A100, 16, 16 * KiB, NCCL),  # should_custom_ar refuses tp > 8 (L497)
    # SM 8.0 / 8.9 have no FlashInfer entry: as in 0.11.0
    (A100, 2, 16 * KiB, ONE),
    (A100, 2, 8 * MiB, NCCL),
    (Link.of("l40s"), 2, 16 * KiB, ONE),
]


@pytest.mark.parametrize(("link", "tp", "nbytes", "expected"), DISPATCH_0_11_0)
def test_dispatch_0_11_0(link, tp, nbytes, expected):
    assert algorithm(nbytes, tp, link, "0.11.0") is expected


@pytest.mark.parametrize("release", ["0.19.1", "0.20.0", "0.25.1", "0.26.0"])
def test_the_pins_between_follow_0_11_0s_chain(release):
    """FlashInfer off by default there (envs.py), the rest as 0.11.0 for the catalog's GPUs."""
    for link, tp, nbytes, expected in DISPATCH_0_11_0:
        assert algorithm(nbytes, tp, link, release) is expected, (link, tp, nbytes)


@pytest.mark.parametrize(("link", "tp", "nbytes", "expected"), DISPATCH_0_33_0)
def test_dispatch_0_33_0(link, tp, nbytes, expected):
    assert algorithm(nbytes, tp, link, "0.33.0") is expected


@given(
    nbytes=st.integers(16, 256 * MiB),
    tp=st.sampled_from([2, 4, 6, 8, 16]),
    gpu=st.sampled_from(sorted(ar.GPU_LINKS)),
    release=st.sampled_from([None, "0.5.4", "4ac7713", *ar.RELEASES]),
)
def test_dispatch_invariants(nbytes, tp, gpu, release):
    """No P2P is always host-staged; a release not mirrored is always NCCL; custom kernels never
    above their 8 MiB buffer; FlashInfer only in 0.33.0; a charge is positive and finite."""
    assert algorithm(nbytes, tp, Link.of(gpu, p2p=False), release) is Algorithm.HOST_STAGED
    kind = algorithm(nbytes, tp, Link.of(gpu), release)
    if release not in ar.RELEASES:
        assert kind is NCCL
    if kind in (ONE, TWO):
        assert nbytes < ar.CUSTOM_BUFFER_BYTES
    if kind is FI:
        assert release == "0.33.0"
    step = MeasuredStepTime(get_model("llama-3.1-8b"), get_gpu(gpu), tp=2, release=release)
    assert step.allreduce_cost is not None
    assert 0 < step.allreduce_cost.time_s(nbytes) < math.inf


def test_the_costs_are_the_least_squares_fit_of_the_cited_points_and_the_tp2_row_is_near():
    """The fit reproduces PR #24111's TP 4 / 6 one-shot points within 15% and two-shot within 20%
    (its TP 4 column reads 27 us at both 1.5 and 2 MB); the TP 2 one-shot row (0.5 MB, 7 us), not
    fitted, within 15%."""
    for points, kind, (lat, bw), tolerance in (
        (ar.ONE_SHOT_POINTS, ONE, (ar.ONE_SHOT_LATENCY_S, ar.ONE_SHOT_PEER_GBPS), 0.15),
        (ar.TWO_SHOT_POINTS, TWO, (ar.TWO_SHOT_LATENCY_S, ar.TWO_SHOT_PEER_GBPS), 0.20),
    ):
        assert ar.fit_peer_cost(points, kind) == (lat, bw)
        for tp, mb, ms in points:
            predicted = lat + ar._traffic(kind, tp) * mb * MiB / (bw * 1e9)
            assert predicted == pytest.approx(ms * 1e-3, rel=tolerance), (tp, mb)
    tp2 = ar.ONE_SHOT_LATENCY_S + 0.5 * MiB / (ar.ONE_SHOT_PEER_GBPS * 1e9)
    assert tp2 == pytest.approx(7e-6, rel=0.15)


def test_docstring_worked_example():
    """Llama-3.1-8B, one decode, two H100s, 0.11.0: 4.56 us per all-reduce against NCCL's
    16.27 us; 0.29 ms against 1.04 ms per step."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    batch = BatchShape((1024,), ())
    new = MeasuredStepTime(model, gpu, tp=2, release="0.11.0")
    old = MeasuredStepTime(model, gpu, tp=2)
    assert new.allreduce_cost is not None and old.allreduce_cost is not None
    assert new.allreduce_cost.time_s(8192) == pytest.approx(4.56e-6, abs=0.01e-6)
    assert old.allreduce_cost.time_s(8192) == pytest.approx(16.27e-6, abs=0.01e-6)
    assert new.breakdown(batch)["allreduce_s"] == pytest.approx(0.29e-3, abs=0.005e-3)
    assert old.breakdown(batch)["allreduce_s"] == pytest.approx(1.04e-3, abs=0.005e-3)


@pytest.mark.parametrize("release", ["0.11.0", "0.33.0"])
@pytest.mark.parametrize("tp", [2, 4])
def test_one_token_decode_on_nvlink_is_charged_the_custom_latency_not_nccls(tp, release):
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    step = MeasuredStepTime(model, gpu, tp=tp, release=release)
    nccl = MeasuredStepTime(model, gpu, tp=tp)
    batch = BatchShape((2048,), ())
    nbytes = model.hidden_size * 2
    per_call = ar.ONE_SHOT_LATENCY_S + (tp - 1) * nbytes / (ar.ONE_SHOT_PEER_GBPS * 1e9)
    calls = 2 * model.num_layers
    assert step.breakdown(batch)["allreduce_s"] == pytest.approx(calls * per_call)
    fitted = nccl.allreduce_cost.nccl
    nccl_call = fitted["latency_s"] + nbytes / (fitted["algbw_GBps"] * 1e9)
    assert nccl.breakdown(batch)["allreduce_s"] == pytest.approx(calls * nccl_call)
    assert per_call < 0.5 * nccl_call
    # only the all-reduce term moved
    new, old = step.breakdown(batch), nccl.breakdown(batch)
    assert {k for k in new if new[k] != old[k]} == {"allreduce_s"}


@pytest.mark.parametrize("release", ["0.11.0", "0.33.0"])
def test_large_messages_still_use_the_nccl_fit(release):
    """An 8,192-token chunk of a 8,192-wide model all-reduces 128 MiB: above every peer-memory
    backend's cap at TP 2 on H100, so charged exactly as before."""
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    batch = BatchShape((), ((0, 8192),))
    step = MeasuredStepTime(model, gpu, tp=2, release=release)
    assert step.allreduce_cost.time_and_algorithm(8192 * 8192 * 2)[1] is NCCL
    assert (
        step.breakdown(batch)["allreduce_s"]
        == MeasuredStepTime(model, gpu, tp=2).breakdown(batch)["allreduce_s"]
    )


@pytest.mark.parametrize("release", [None, "0.11.0", "0.33.0"])
def test_p2p_false_still_takes_the_host_staged_path(release):
    model, gpu = get_model("qwen2.5-7b"), get_gpu("a100-80gb-sxm")
    step = MeasuredStepTime(model, gpu, tp=2, p2p=False, release=release)
    c = host_staged_allreduce(2)
    nbytes = model.hidden_size * 2
    time_s, kind = step.allreduce_cost.time_and_algorithm(nbytes)
    assert kind is Algorithm.HOST_STAGED
    assert time_s == pytest.approx(c["latency_s"] + nbytes / (c["algbw_GBps"] * 1e9))


def test_an_unmirrored_release_keeps_the_nccl_fit():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    batch = BatchShape((512,) * 4, ())
    assert MeasuredStepTime(model, gpu, tp=2, release="0.5.4").predict_s(batch) == MeasuredStepTime(
        model, gpu, tp=2
    ).predict_s(batch)


def test_the_scenarios_pinned_release_reaches_the_step_time_model():
    base = {
        "name": "ar",
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "tensor_parallel_size": 2},
        "scheduler": {"design": "v1-engine", "vllm_version": "0.11.0"},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0, "prompt_tokens": 16, "output_tokens": 2}],
        },
    }
    model = step_time_model(scenario_from_dict(base, "ar.yaml"))
    assert isinstance(model, MeasuredStepTime) and model.release == "0.11.0"
    del base["scheduler"]["vllm_version"]
    assert step_time_model(scenario_from_dict(base, "ar.yaml")).release == "0.33.0"
    direct = make_step_time(None, "llama-3.1-8b", "h100-sxm", tp=2, release="0.33.0")
    assert direct.release == "0.33.0"


@pytest.mark.parametrize(("gpu", "interconnect_GBps"), [("a100-80gb-sxm", 600), ("l40s", 64)])
def test_custom_bandwidth_scales_by_the_datasheet_interconnect_and_latency_is_kept(
    gpu, interconnect_GBps
):
    """Off the H100 (900 GB/s NVLink) the fitted peer bandwidth scales by the GPU's interconnect:
    A100 x600/900, an L40S over PCIe x64/900; the latency stays the H100's."""
    assert get_gpu(gpu).interconnect_GBps == interconnect_GBps
    step = MeasuredStepTime(get_model("llama-3.1-8b"), get_gpu(gpu), tp=2, release="0.11.0")
    nbytes = 64 * KiB
    time_s, kind = step.allreduce_cost.time_and_algorithm(nbytes)
    assert kind is ONE
    peer_GBps = ar.ONE_SHOT_PEER_GBPS * interconnect_GBps / 900
    assert time_s == pytest.approx(ar.ONE_SHOT_LATENCY_S + nbytes / (peer_GBps * 1e9))
