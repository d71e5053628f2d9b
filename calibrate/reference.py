"""Float64 dense references every kernel is checked against before it is timed.

The references are deliberately naive (explicit softmax, repeat_interleave for GQA) so they
share no code path with the kernels they judge.
"""

from __future__ import annotations

import math

import torch


def _attention64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor):
    """q [Hq, Sq, D], k/v [Hkv, Sk, D], allowed [Sq, Sk] -> [Hq, Sq, D] in float64."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)
    v = v.repeat_interleave(groups, dim=0)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: list[int],
) -> torch.Tensor:
    """One query token per sequence attending to its first `context_lens[i]` cached tokens.

    q [B, Hq, D]; caches [num_blocks, block_size, Hkv, D]; block_table [B, max_blocks].
    Returns [B, Hq, D] float64. Sequence i's token t lives in block
    `block_table[i, t // block_size]` at offset `t % block_size`.
    """
    block_size = k_cache.shape[1]
    out = []
    for i, length in enumerate(context_lens):
        num_blocks = -(-length // block_size)
        ids = block_table[i, :num_blocks].long()
        k = k_cache[ids].reshape(-1, *k_cache.shape[2:])[:length].transpose(0, 1)
        v = v_cache[ids].reshape(-1, *v_cache.shape[2:])[:length].transpose(0, 1)
        allowed = torch.ones(1, length, dtype=torch.bool, device=q.device)
        out.append(_attention64(q[i].unsqueeze(1), k, v, allowed).squeeze(1))
    return torch.stack(out)


def prefill_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A chunk of Sq queries after Sk - Sq cached tokens, causal: query i sees keys <= prior+i.

    q [Hq, Sq, D], k/v [Hkv, Sk, D] -> [Hq, Sq, D] float64.
    """
    sq, sk = q.shape[1], k.shape[1]
    prior = sk - sq
    rows = torch.arange(sq, device=q.device).unsqueeze(1)
    cols = torch.arange(sk, device=q.device).unsqueeze(0)
    return _attention64(q, k, v, cols <= rows + prior)


def gemm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T in float64."""
    return x.double() @ weight.double().T


def max_rel_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """max |actual - ref| / max |ref|: one number, robust to near-zero elements."""
    diff = (actual.double() - reference).abs().max().item()
    return diff / max(reference.abs().max().item(), 1e-300)
