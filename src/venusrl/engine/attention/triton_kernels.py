"""Triton kernels over the paged KV pool: store new K/V into their slots, decode attention
(one query per sequence, the context split across programs and merged), and extend attention
(new tokens over a cached prefix and themselves, causal: prefill and its chunks).

Every kernel reads a token's K/V at `pool[table[row, position]]`: the slot table
(slot_table.py) is the page table at token granularity, so a context's pages need not be
contiguous nor aligned and a prefix shared through the radix cache is read where it lies.
Shapes are fixed by the pool and the model; only the grids depend on the batch, so a decode
step's launches can be captured in a CUDA graph per batch size. Lengths are read on the
device: no host value of the step decides a launch parameter beyond the batch size.

Layouts: pool layer [slots, kv_heads, head_dim] (contiguous); q [tokens, heads, head_dim]
with head_dim contiguous; query head h reads KV head h // (heads / kv_heads).
The design follows SGLang's Triton backend (decode_attention: split-KV then a merge over the
splits, a block of query heads per KV head for grouped-query attention; extend_attention) and
nano-vllm's store_kvcache; the code is this project's.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_pool_ptr, v_pool_ptr, slots_ptr, stride_k_token, stride_v_token,
                     stride_pool_slot, ROW: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slots_ptr + token)
    if slot >= 0:  # negative: a padding row of a CUDA-graph bucket, nothing to store
        offsets = tl.arange(0, BLOCK)
        mask = offsets < ROW
        k = tl.load(k_ptr + token * stride_k_token + offsets, mask=mask)
        v = tl.load(v_ptr + token * stride_v_token + offsets, mask=mask)
        tl.store(k_pool_ptr + slot * stride_pool_slot + offsets, k, mask=mask)
        tl.store(v_pool_ptr + slot * stride_pool_slot + offsets, v, mask=mask)


def store_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """k_pool, v_pool: one layer [slots, kv_heads, head_dim]; k, v [tokens, kv_heads, head_dim]
    (heads and head_dim contiguous); slots [tokens] (int64, negative: skipped)."""
    tokens, kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    _check_rows(k, "k")
    _check_rows(v, "v")
    row = kv_heads * head_dim
    _store_kv_kernel[(tokens,)](k, v, k_pool, v_pool, slots, k.stride(0), v.stride(0), k_pool.stride(0),
                                ROW=row, BLOCK=triton.next_power_of_2(row))


def _check_rows(x: torch.Tensor, name: str) -> None:
    if x.stride(-1) != 1 or x.stride(-2) != x.shape[-1]:
        raise ValueError(f"{name}: heads and head_dim must be contiguous, strides {tuple(x.stride())}")


@triton.jit
def _decode_split_kernel(q_ptr, k_pool_ptr, v_pool_ptr, table_ptr, rows_ptr, lengths_ptr, q_rows_ptr,
                         part_out_ptr, part_lse_ptr, sm_scale,
                         stride_q_token, stride_q_head, stride_table_row, stride_pool_slot, stride_pool_head,
                         NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                         PRECISION: tl.constexpr):
    """Program (b, kv_head, split): the GROUP query heads of one KV head of sequence b over one
    split of its context; writes their partial output (normalised) and log-sum-exp."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lengths_ptr + b)
    row = tl.load(rows_ptr + b)
    q_row = tl.load(q_rows_ptr + b)
    h = tl.arange(0, BLOCK_H)
    head_mask = h < GROUP
    heads = kv_head * GROUP + h
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + q_row * stride_q_token + heads[:, None] * stride_q_head + d[None, :],
                mask=head_mask[:, None] & d_mask[None, :], other=0.0)
    per_split = tl.cdiv(length, SPLITS)
    start = split * per_split
    end = tl.minimum(start + per_split, length)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        slots = tl.load(table_ptr + row * stride_table_row + n, mask=n_mask, other=0)
        kv_offsets = slots[:, None] * stride_pool_slot + kv_head * stride_pool_head + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_pool_ptr + kv_offsets, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        scores = tl.where(n_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_pool_ptr + kv_offsets, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    has_keys = l_i > 0  # an empty split (or a padding row, length 0) contributes nothing
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
    part = (b * NUM_HEADS + heads) * SPLITS + split
    tl.store(part_out_ptr + part[:, None] * BLOCK_D + d[None, :], out, mask=head_mask[:, None])
    tl.store(part_lse_ptr + part, lse, mask=head_mask)


@triton.jit
def _decode_merge_kernel(part_out_ptr, part_lse_ptr, out_ptr, q_rows_ptr, stride_out_token, stride_out_head,
                         NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
                         BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (b, head): the splits' partial outputs weighted by their share of the softmax."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_mask = s < SPLITS
    d = tl.arange(0, BLOCK_D)
    base = (b * NUM_HEADS + head) * SPLITS
    lse = tl.load(part_lse_ptr + base + s, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no keys at all (a padding row): output 0
    weights = tl.exp(lse - top)
    parts = tl.load(part_out_ptr + (base + s)[:, None] * BLOCK_D + d[None, :], mask=s_mask[:, None], other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    q_row = tl.load(q_rows_ptr + b)
    tl.store(out_ptr + q_row * stride_out_token + head * stride_out_head + d, out.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)


@triton.jit
def _extend_kernel(q_ptr, k_pool_ptr, v_pool_ptr, table_ptr, out_ptr, rows_ptr, prefix_ptr, new_ptr, q_start_ptr,
                   sm_scale, stride_q_token, stride_q_head, stride_out_token, stride_out_head, stride_table_row,
                   stride_pool_slot, stride_pool_head,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Program (sequence, head, query block): BLOCK_M new tokens of one head over the keys at
    or before each one's position (the cached prefix, then the new tokens themselves)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    block = tl.program_id(2)
    new_len = tl.load(new_ptr + seq)
    if block * BLOCK_M < new_len:
        prefix = tl.load(prefix_ptr + seq)
        row = tl.load(rows_ptr + seq)
        q_start = tl.load(q_start_ptr + seq)
        kv_head = head // GROUP
        m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = m < new_len
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        q = tl.load(q_ptr + (q_start + m)[:, None] * stride_q_token + head * stride_q_head + d[None, :],
                    mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        q_pos = prefix + m
        end = tl.minimum(prefix + (block + 1) * BLOCK_M, prefix + new_len)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for n0 in range(0, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < end
            slots = tl.load(table_ptr + row * stride_table_row + n, mask=n_mask, other=0)
            kv_offsets = slots[:, None] * stride_pool_slot + kv_head * stride_pool_head + d[None, :]
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_pool_ptr + kv_offsets, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
            # key 0 is visible to every query, so no row of the first block is all -inf
            visible = (n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            scores = tl.where(visible, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(v_pool_ptr + kv_offsets, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + (q_start + m)[:, None] * stride_out_token + head * stride_out_head + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _precision(dtype: torch.dtype) -> str:
    # float32 pools (CPU models, tests) multiply exactly; tf32 would cost them 3 digits
    return "ieee" if dtype == torch.float32 else "tf32"


def decode_splits(batch: int, kv_heads: int, device: torch.device) -> int:
    """Splits of each context: enough programs to fill the device's SMs twice over (a batch of
    one would otherwise run on kv_heads SMs), at most 16. A function of the batch size only,
    so a CUDA graph captured for a batch size replays with the same grid."""
    if device.type != "cuda":
        return 2  # the interpreter: two splits exercise the merge at no cost
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = math.ceil(2 * sms / max(1, batch * kv_heads))
    return max(1, min(16, triton.next_power_of_2(wanted)))


def _blocks(device: torch.device, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): tl.dot needs 16 at least; the interpreter runs small blocks faster."""
    if device.type != "cuda":
        return 16, 16
    return (64, 64) if head_dim <= 128 else (32, 32)


def decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                     rows: torch.Tensor, lengths: torch.Tensor, q_rows: torch.Tensor, out: torch.Tensor,
                     part_out: torch.Tensor, part_lse: torch.Tensor, sm_scale: float) -> None:
    """One query per sequence b: q[q_rows[b]] attends over the first lengths[b] tokens of
    table row rows[b]; the result goes to out[q_rows[b]]. part_out [B, heads, splits, BLOCK_D]
    and part_lse [B, heads, splits] are float32 scratch (`decode_scratch`)."""
    batch = rows.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_pool.shape[1]
    group = num_heads // kv_heads
    splits = part_lse.shape[2]
    block_d = part_out.shape[3]
    _, block_n = _blocks(q.device, head_dim)
    _decode_split_kernel[(batch, kv_heads, splits)](
        q, k_pool, v_pool, table, rows, lengths, q_rows, part_out, part_lse, sm_scale,
        q.stride(0), q.stride(1), table.stride(0), k_pool.stride(0), k_pool.stride(1),
        NUM_HEADS=num_heads, GROUP=group, HEAD_DIM=head_dim, SPLITS=splits, BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, PRECISION=_precision(k_pool.dtype))
    _decode_merge_kernel[(batch, num_heads)](
        part_out, part_lse, out, q_rows, out.stride(0), out.stride(1),
        # a block of at least 2 splits (the last masked when there is one) keeps the merge a reduction
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, SPLITS=splits, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        BLOCK_D=block_d)


def decode_scratch(batch: int, num_heads: int, kv_heads: int, head_dim: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    splits = decode_splits(batch, kv_heads, device)
    block_d = triton.next_power_of_2(head_dim)
    return (torch.empty(batch, num_heads, splits, block_d, dtype=torch.float32, device=device),
            torch.empty(batch, num_heads, splits, dtype=torch.float32, device=device))


def extend_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                     rows: torch.Tensor, prefix_lens: torch.Tensor, new_lens: torch.Tensor, q_starts: torch.Tensor,
                     max_new: int, out: torch.Tensor, sm_scale: float) -> None:
    """Sequence s's new_lens[s] queries q[q_starts[s]:][:new_lens[s]] sit at positions
    prefix_lens[s].. of table row rows[s]; each sees the keys at or before its position. Their
    own K/V must be in the pool already (`store_kv`)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_pool.shape[1]
    block_m, block_n = _blocks(q.device, head_dim)
    grid = (rows.shape[0], num_heads, triton.cdiv(max_new, block_m))
    _extend_kernel[grid](
        q, k_pool, v_pool, table, out, rows, prefix_lens, new_lens, q_starts, sm_scale,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), table.stride(0), k_pool.stride(0), k_pool.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=_precision(k_pool.dtype))
