"""Kernels a calibration times: paged decode attention, prefill attention, linear-layer GEMMs.

Decode attention over a paged KV cache (caches `[num_blocks, block_size, Hkv, D]`, a block
table `[B, max_blocks]` of int32 block ids, one query token per sequence):

- `torch-gather-sdpa` (always): gather each sequence's blocks through the block table into a
  preallocated buffer, then `scaled_dot_product_attention(enable_gqa=True)` with a length mask.
  It copies the KV it reads, so it moves about twice the ideal bytes: a naive baseline.
- `flex-paged` (torch >= 2.5): FlexAttention over the whole block pool, with a mask that lets
  query i see only the slots of sequence i's blocks below its length (the idea behind torch's
  private `_paged_attention.PagedAttention`, written without it). Compiled on CUDA (a
  flash-decoding Triton kernel); eager on CPU.
- adapters, when the package imports (UNTESTED here: none is installed on our machines):
  `vllm-paged-v2` (`vllm._custom_ops.paged_attention_v2`, its 5-D key layout),
  `flash-attn` (`flash_attn_with_kvcache(block_table=...)`; upstream needs pages of 256),
  `flashinfer` (`BatchDecodeWithPagedKVCacheWrapper`, plan then run).

Each `prepare_*` function allocates everything up front and returns a zero-argument closure, so
the timed region holds only the kernel.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Runner = Callable[[], torch.Tensor]


@dataclass(slots=True)
class PagedBatch:
    """A decode batch over a paged cache (see module docstring for layouts)."""

    q: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_table: torch.Tensor  # [B, max_blocks] int32, padded with 0
    context_lens: list[int]
    context_lens_t: torch.Tensor  # [B] int32

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def make_paged_batch(
    context_lens: list[int],
    *,
    block_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> PagedBatch:
    """Random q/K/V with each sequence's blocks scattered by a seeded permutation.

    Example: lens [5, 3], block_size 4 -> 2 + 1 = 3 blocks, permuted e.g. to [2, 0 | 1].
    """
    if not context_lens or min(context_lens) <= 0:
        raise ValueError("context_lens must be non-empty and positive")
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(n / block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq)
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = perm[start : start + n].to(torch.int32)
        start += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    q = torch.randn(len(context_lens), num_q_heads, head_dim, generator=gen)
    lens_t = torch.tensor(context_lens, dtype=torch.int32, device=device)
    return PagedBatch(q.to(device, dtype), k, v, table.to(device), list(context_lens), lens_t)


# -- decode kernels ---------------------------------------------------------------------------
def prepare_torch_gather(batch: PagedBatch) -> Runner:
    """Gather blocks (index_select into a reused buffer), then masked SDPA with GQA."""
    num_seqs, max_blocks = batch.block_table.shape
    bs, hkv, d = batch.k_cache.shape[1:]
    flat_ids = batch.block_table.reshape(-1).long()
    k_buf = torch.empty(num_seqs * max_blocks, bs, hkv, d, dtype=batch.k_cache.dtype,
                        device=batch.k_cache.device)  # fmt: skip
    v_buf = torch.empty_like(k_buf)
    positions = torch.arange(max_blocks * bs, device=batch.k_cache.device)
    mask = (positions.unsqueeze(0) < batch.context_lens_t.unsqueeze(1).long())[:, None, None, :]
    q = batch.q.unsqueeze(2)  # [B, Hq, 1, D]

    def run() -> torch.Tensor:
        torch.index_select(batch.k_cache, 0, flat_ids, out=k_buf)
        torch.index_select(batch.v_cache, 0, flat_ids, out=v_buf)
        k = k_buf.view(num_seqs, max_blocks * bs, hkv, d).transpose(1, 2)
        v = v_buf.view(num_seqs, max_blocks * bs, hkv, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.squeeze(2)

    return run


def flex_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def prepare_flex_paged(batch: PagedBatch) -> Runner:
    """FlexAttention over the block pool: query i sees slots of its own blocks below its length."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = batch.k_cache.device
    num_blocks, bs, hkv, d = batch.k_cache.shape
    num_slots = num_blocks * bs
    owner = torch.full((num_slots,), -1, dtype=torch.int64, device=device)
    logical = torch.zeros(num_slots, dtype=torch.int64, device=device)
    for i, length in enumerate(batch.context_lens):
        for j in range(math.ceil(length / bs)):
            block = int(batch.block_table[i, j])
            owner[block * bs : (block + 1) * bs] = i
            logical[block * bs : (block + 1) * bs] = torch.arange(j * bs, (j + 1) * bs)
    lens = batch.context_lens_t.long()

    def mask_mod(b, h, q_idx, kv_idx):
        return (owner[kv_idx] == q_idx) & (logical[kv_idx] < lens[q_idx])

    num_seqs = len(batch.context_lens)
    block_mask = create_block_mask(mask_mod, None, None, num_seqs, num_slots, device=str(device))
    q = batch.q.transpose(0, 1).unsqueeze(0)  # [1, Hq, B, D]: query index = sequence
    k = batch.k_cache.view(1, num_slots, hkv, d).transpose(1, 2)
    v = batch.v_cache.view(1, num_slots, hkv, d).transpose(1, 2)
    fn = torch.compile(flex_attention, dynamic=False) if device.type == "cuda" else flex_attention

    def run() -> torch.Tensor:
        with warnings.catch_warnings():
            # Eager flex on CPU warns that it materialises the scores; that is what we time.
            warnings.simplefilter("ignore", UserWarning)
            out = fn(q, k, v, block_mask=block_mask, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1)  # [B, Hq, D]

    return run


def prepare_flash_attn(batch: PagedBatch) -> Runner:  # pragma: no cover - needs flash-attn
    from flash_attn import flash_attn_with_kvcache

    q = batch.q.unsqueeze(1)  # [B, 1, Hq, D]

    def run() -> torch.Tensor:
        out = flash_attn_with_kvcache(
            q, batch.k_cache, batch.v_cache, cache_seqlens=batch.context_lens_t,
            block_table=batch.block_table,
        )  # fmt: skip
        return out.squeeze(1)

    return run


def prepare_flashinfer(batch: PagedBatch) -> Runner:  # pragma: no cover - needs flashinfer
    import flashinfer

    device = batch.k_cache.device
    bs = batch.block_size
    counts = [math.ceil(n / bs) for n in batch.context_lens]
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.cat([batch.block_table[i, :c].cpu() for i, c in enumerate(counts)])
    last = torch.tensor([n - (c - 1) * bs for n, c in zip(batch.context_lens, counts, strict=True)],
                        dtype=torch.int32)  # fmt: skip
    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    hq, d = batch.q.shape[1:]
    hkv = batch.k_cache.shape[2]
    wrapper.plan(indptr.to(device), indices.to(device), last.to(device), hq, hkv, d, bs,
                 data_type=batch.k_cache.dtype, q_data_type=batch.q.dtype)  # fmt: skip

    def run() -> torch.Tensor:
        return wrapper.run(batch.q, (batch.k_cache, batch.v_cache))

    return run


def prepare_vllm_paged(batch: PagedBatch) -> Runner:  # pragma: no cover - needs vllm
    from vllm import _custom_ops as ops

    num_blocks, bs, hkv, d = batch.k_cache.shape
    x = 16 // batch.k_cache.element_size()
    # vLLM layouts: key [blocks, Hkv, D/x, bs, x], value [blocks, Hkv, D, bs].
    key = batch.k_cache.view(num_blocks, bs, hkv, d // x, x).permute(0, 2, 3, 1, 4).contiguous()
    value = batch.v_cache.permute(0, 2, 3, 1).contiguous()
    out = torch.empty_like(batch.q)
    max_len = max(batch.context_lens)
    num_parts = math.ceil(max_len / 512)
    b, hq = batch.q.shape[:2]
    exp_sums = torch.empty(b, hq, num_parts, dtype=torch.float32, device=out.device)
    max_logits = torch.empty_like(exp_sums)
    tmp = torch.empty(b, hq, num_parts, d, dtype=out.dtype, device=out.device)
    scale_one = torch.tensor(1.0, dtype=torch.float32, device=out.device)

    def run() -> torch.Tensor:
        ops.paged_attention_v2(
            out, exp_sums, max_logits, tmp, batch.q, key, value, hkv, 1.0 / math.sqrt(d),
            batch.block_table, batch.context_lens_t, bs, max_len, None, "auto",
            scale_one, scale_one,
        )  # fmt: skip
        return out

    return run


def decode_kernels(device: str) -> dict[str, Callable[[PagedBatch], Runner] | str]:
    """Every decode kernel: its `prepare` function, or the reason it is unavailable."""
    found: dict[str, Callable[[PagedBatch], Runner] | str] = {
        "torch-gather-sdpa": prepare_torch_gather,
        "flex-paged": prepare_flex_paged if flex_available() else "torch lacks flex_attention",
    }
    adapters = {
        "vllm-paged-v2": ("vllm._custom_ops", prepare_vllm_paged),
        "flash-attn": ("flash_attn", prepare_flash_attn),
        "flashinfer": ("flashinfer", prepare_flashinfer),
    }
    for name, (module, prepare) in adapters.items():
        if device != "cuda":
            found[name] = "CUDA only"
            continue
        try:
            __import__(module)
        except Exception as exc:  # ImportError, or a broken CUDA extension
            found[name] = f"{module} does not import ({type(exc).__name__})"
        else:
            found[name] = prepare
    return found


# -- prefill attention and GEMMs ----------------------------------------------------------------
def prepare_prefill(
    prior_tokens: int, chunk_tokens: int, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
    dtype: torch.dtype, device: str, seed: int = 0,
) -> tuple[Runner, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:  # fmt: skip
    """Causal SDPA of a chunk after `prior_tokens` cached tokens (contiguous K/V, GQA).

    Returns the runner and (q [Hq, p, D], k, v [Hkv, c + p, D]) for the reference check.
    """
    gen = torch.Generator().manual_seed(seed)
    total = prior_tokens + chunk_tokens
    q = torch.randn(num_q_heads, chunk_tokens, head_dim, generator=gen).to(device, dtype)
    k = torch.randn(num_kv_heads, total, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(num_kv_heads, total, head_dim, generator=gen).to(device, dtype)
    rows = torch.arange(chunk_tokens, device=device).unsqueeze(1)
    mask = torch.arange(total, device=device).unsqueeze(0) <= rows + prior_tokens
    causal_only = prior_tokens == 0

    def run() -> torch.Tensor:
        if causal_only:  # lets SDPA pick its flash backend
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                 enable_gqa=True)  # fmt: skip
        else:
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                                 enable_gqa=True)  # fmt: skip
        return out[0]

    return run, (q, k, v)


def make_weight(
    in_features: int, out_features: int, *, dtype: torch.dtype, device: str, seed: int = 0,
    block_rows: int = 1024,
) -> torch.Tensor:  # fmt: skip
    """A [N, K] weight of uniform values in +-1/sqrt(K): `block_rows` random rows, repeated.

    Drawing every value of an lm_head (128256 x 4096) took 14 s on a CPU with randn, longer
    than a 20 s calibration budget can give it; repeating a random block is a memory copy.
    A GEMM's time does not depend on the values beyond their being random-looking (GPUs run a
    matmul of zeros faster: less switching), and the check compares the first rows only.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    bound = 1.0 / math.sqrt(in_features)
    rows = min(out_features, block_rows)
    block = torch.empty(rows, in_features, device=device, dtype=torch.float32)
    block = block.uniform_(-bound, bound, generator=gen).to(dtype)
    copies = -(-out_features // rows)
    return block.repeat(copies, 1)[:out_features].contiguous()


def prepare_gemm(
    tokens: int, in_features: int, out_features: int, *, dtype: torch.dtype, device: str,
    seed: int = 0, weight: torch.Tensor | None = None,
) -> tuple[Runner, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """`F.linear(x [T, K], weight [N, K])`, the shape of one linear layer at T tokens.

    `weight` (from `make_weight`) is reused when given: a sweep times one weight at many T.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_features, generator=gen).to(device, dtype)
    if weight is None:
        weight = make_weight(in_features, out_features, dtype=dtype, device=device, seed=seed + 1)
    w = weight

    def run() -> torch.Tensor:
        return F.linear(x, w)

    return run, (x, w)
