"""Step time from a calibration profile: measured per-layer operators, summed over a step.

    t = sum over layers of [ linear(T)                              (interpolated GEMM points)
                             + decode(#decodes, sum of contexts)    (a + b*n + c*ctx)
                             + sum over chunks prefill(p, pairs) ]  (a + b*p + c*pairs)
        + lm_head(S) + all-reduce (roofline formula, tp > 1; not measured) + overhead_s

T = tokens in the step, S = sampled tokens (#decodes + #chunks). Sliding-window layers see
contexts capped at the window. Kernels are timed one at a time, so the sum ignores overlap and
fusion between them (a calibrated step is an upper bound of the kernels' sum, plus overhead).
`linear(T)` interpolates linearly between measured token counts and extrapolates from the last
segment's slope (Vidur interpolates its profiles the same way, with a random forest instead).

Example: a profile whose layer GEMMs take 1 ms at every T <= 64, decode fit (0, 1e-6, 1e-8),
2 layers, lm_head 0.1 ms, overhead 0.3 ms: 4 decodes at 1000 context ->
2 x (1 ms + 4 us + 40 us) + 0.1 ms + 0.3 ms = 2.488 ms.
"""

from __future__ import annotations

from bisect import bisect_right

from sim.catalog import GpuSpec, dtype_bytes
from sim.latency.band import StepTimeBand
from sim.latency.batch import BatchShape
from sim.latency.profile import LAYER_GEMMS, ProfileError, StepTimeProfile
from sim.latency.roofline import Efficiencies


class PiecewiseLinear:
    """y(x) through sorted points; beyond the ends, the first/last segment's line (>= 0)."""

    __slots__ = ("xs", "ys")

    def __init__(self, xs: list[float], ys: list[float]) -> None:
        if len(xs) != len(ys) or not xs:
            raise ValueError("PiecewiseLinear needs equal, non-empty xs and ys")
        if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
            raise ValueError("PiecewiseLinear xs must be strictly increasing")
        self.xs, self.ys = list(xs), list(ys)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = bisect_right(xs, x) - 1
        i = 0 if i < 0 else (len(xs) - 2 if i > len(xs) - 2 else i)
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return y if y > 0.0 else 0.0


class CalibratedStepTime:
    __slots__ = (
        "profile",
        "_linear",
        "_lm_head",
        "_dec",
        "_pre",
        "_num_full",
        "_num_slide",
        "_window",
        "_overhead_s",
        "_ar_fixed_s",
        "_ar_s_per_token",
    )

    def __init__(
        self,
        profile: StepTimeProfile,
        *,
        gpu: GpuSpec | None = None,
        efficiencies: Efficiencies | None = None,
    ) -> None:
        eff = efficiencies or Efficiencies()
        self.profile = profile
        model = profile.model
        gemms = profile.gemms
        xs = [p.params["tokens"] for p in gemms[LAYER_GEMMS[0]].points]
        for name in LAYER_GEMMS[1:]:
            if [p.params["tokens"] for p in gemms[name].points] != xs:
                raise ProfileError(f"profile gemms.{name} was measured at other token counts")
        layer_sum = [sum(gemms[n].points[i].median_s for n in LAYER_GEMMS) for i in range(len(xs))]
        self._linear = PiecewiseLinear(xs, layer_sum)
        lm = gemms["lm_head"].points
        self._lm_head = PiecewiseLinear([p.params["tokens"] for p in lm], [p.median_s for p in lm])
        self._dec = tuple(profile.decode_attention.fit.coefficients)
        self._pre = tuple(profile.prefill_attention.fit.coefficients)
        self._num_full = model.num_full_layers
        self._num_slide = model.num_sliding_layers
        self._window = model.sliding_window
        self._overhead_s = eff.overhead_s
        tp = profile.tp
        if tp > 1:
            if gpu is None:
                raise ValueError("a tp > 1 profile needs the GPU (interconnect) for all-reduce")
            per_direction_Bps = eff.network * gpu.interconnect_GBps * 1e9 / 2.0
            act_bytes = dtype_bytes(profile.dtype)
            bytes_per_token = 2 * model.num_layers * model.hidden_size * act_bytes
            self._ar_fixed_s = 2 * model.num_layers * eff.allreduce_latency_s
            self._ar_s_per_token = bytes_per_token * 2.0 * (tp - 1) / tp / per_direction_Bps
        else:
            self._ar_fixed_s = self._ar_s_per_token = 0.0

    def _decode_s(self, num_seqs: int, context_tokens: float) -> float:
        a, b, c = self._dec
        return a + b * num_seqs + c * context_tokens

    @property
    def decode_window(self) -> int | None:
        """The attention window of the sliding-window layers (decode context sums cap at it)."""
        return self._window

    def band(self) -> StepTimeBand:
        """No band yet: the profile's fits are per kernel, never checked against whole steps."""
        device = self.profile.metadata.device_name
        return StepTimeBand(
            1.0,
            1.0,
            extrapolated=True,
            source=f"calibrated profile ({device}): kernel sums, not validated on whole steps",
        )

    def predict_s(self, batch: BatchShape) -> float:
        chunks = batch.prefill_chunks
        num_dec = batch.num_decode_seqs
        num_tokens = num_dec
        a, b, c = self._pre
        pre_full = pre_win = 0.0
        window = self._window
        for prior, chunk in chunks:
            num_tokens += chunk
            pre_full += a + b * chunk + c * chunk * (prior + (chunk + 1) * 0.5)
            if window is not None:
                pre_win += a + b * chunk + c * chunk * min(prior + (chunk + 1) * 0.5, window)
        if num_tokens == 0:
            return self._overhead_s
        per_layer_full = self._linear(num_tokens) + pre_full
        total = 0.0
        if num_dec:
            if self._num_full:
                total += self._num_full * self._decode_s(num_dec, batch.decode_context_sum)
            if self._num_slide:
                ctx_win = batch.decode_windowed_context_sum(window)  # type: ignore[arg-type]  # sliding layers: a window
                total += self._num_slide * self._decode_s(num_dec, ctx_win)
        total += self._num_full * per_layer_full
        total += self._num_slide * (per_layer_full - pre_full + pre_win)
        total += self._lm_head(num_dec + len(chunks))
        if self._ar_fixed_s:
            total += self._ar_fixed_s + self._ar_s_per_token * num_tokens
        return total + self._overhead_s
