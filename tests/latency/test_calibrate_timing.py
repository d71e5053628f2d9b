"""calibrate.timing on CUDA, without a GPU: the order of what it enqueues (a fake torch.cuda).

Regression (found on the H200 calibration, 2026-12-04): events recorded around each launch of a
kernel shorter than its launch timed the host, not the kernel (a 33 MB GEMM read 42 us where HBM
takes ~8 us). The repeats are now enqueued behind a GPU sleep that outlasts the host.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from calibrate import timing  # noqa: E402


class _FakeCuda:
    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = 0.0

            def record(self) -> None:
                fake.log.append(("record", None))

            def elapsed_time(self, end: Event) -> float:
                return 0.01  # ms

        self.Event = Event

    def synchronize(self) -> None:
        self.log.append(("synchronize", None))

    def reset_peak_memory_stats(self) -> None:
        pass

    def max_memory_allocated(self) -> int:
        return 0

    def _sleep(self, cycles: int) -> None:
        self.log.append(("sleep", cycles))


def test_cuda_timing_holds_the_gpu_before_the_first_event_h200_launch_bound_gemm(monkeypatch):
    fake = _FakeCuda()
    for name in (
        "Event",
        "synchronize",
        "reset_peak_memory_stats",
        "max_memory_allocated",
        "_sleep",
    ):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    calls: list[int] = []

    def run() -> None:
        fake.log.append(("run", None))
        calls.append(1)

    t = timing.time_runner(run, device="cuda", warmup=2, repeats=5)
    kinds = [k for k, _ in fake.log]
    first_record = kinds.index("record")
    sleeps = [i for i, k in enumerate(kinds) if k == "sleep"]
    assert len(sleeps) == 1 and sleeps[0] < first_record  # one hold, before any timed event
    assert kinds[sleeps[0] - 1] == "synchronize"  # after the warm-up has drained
    assert kinds[first_record:].count("run") == 5 and len(calls) == 7
    assert fake.log[sleeps[0]][1] >= timing.hold_cycles(0.0, 5)
    assert len(t.samples_s) == 5 and t.median_s == pytest.approx(1e-5)


@pytest.mark.parametrize(
    ("host_s", "repeats", "expected_s"),
    [(150e-6, 20, 6e-3), (10e-6, 20, 1e-3), (1.0, 20, 0.2)],
)
def test_hold_outlasts_the_host_enqueue_within_floor_and_ceiling(host_s, repeats, expected_s):
    assert timing.hold_cycles(host_s, repeats) == pytest.approx(
        expected_s * timing.HOLD_CLOCK_HZ, abs=1
    )
