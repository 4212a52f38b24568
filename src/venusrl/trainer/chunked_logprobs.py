"""Log-probs and entropy of sampled tokens from final hidden states, a chunk of tokens at a time.

The full computation, `losses.token_logprobs_and_entropy(hidden @ Wᵀ / T, labels)`, holds
float32 [tokens, vocab] tensors (logits, log-softmax, its exp) through forward and backward: at
Qwen3's 151,936 entries 0.6 MB a token, 19 GB for a 32k-token trajectory. Here forward keeps only
its inputs; each chunk's logits are computed, reduced to two numbers a token and dropped, and
backward recomputes them chunk by chunk (as activation checkpointing would) to form the
gradient. Peak extra memory is a few [chunk, vocab] float32 tensors plus the weight's gradient.

Per token, with z = h·Wᵀ / T (float32), p = softmax(z), log p = log_softmax(z):
  log-prob  ℓ = log p[label]            ∂ℓ/∂z = onehot(label) − p
  entropy   H = −Σ p·log p              ∂H/∂z = −p ⊙ (log p + H)
and ∂z/∂h = W / T, ∂z/∂W = h / T. A negative label (the −100 ignore index) has ℓ = 0 and no
ℓ-gradient, as in `token_logprobs_and_entropy`.

The matmuls run in `compute_dtype` (bf16 under mixed precision; float32 accumulation inside the
GEMM, as autocast's lm_head would), the softmax math in float32; the weight's gradient is
summed over chunks in float32 and returned in the weight's dtype.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def chunked_logprobs_and_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int,
    temperature: float = 1.0, compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`hidden` [N, H] (the states that predict `labels` [N]), `weight` [V, H] (the LM head's):
    log p(label) and the entropy, both [N] float32, differentiable in `hidden` and `weight`.
    `compute_dtype`: of the matmuls; default the weight's."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, H] and weight [V, H], got {tuple(hidden.shape)} and {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels must be [N] = [{hidden.shape[0]}], got {tuple(labels.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be ≥ 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _ChunkedLogprobs.apply(hidden, weight, labels, chunk_tokens, temperature, compute_dtype or weight.dtype)


def _chunk_stats(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk's log_softmax and softmax ([n, V] float32, the only two alive at once), its
    label log-probs [n] and entropy [n]; `weight` is already in `dtype`. Autocast is off: the
    trainer calls this under it, and it would run the entropy's bmm on bf16-rounded p and log p
    (0.028 off at an entropy of 8.4); every dtype here is explicit."""
    with _autocast_off(h.device):
        z = (h.to(dtype) @ weight.T).float()
        if temperature != 1.0:
            z.div_(temperature)
        log_p = torch.log_softmax(z, dim=-1)
        del z
        p = log_p.exp()
        token_logprobs = log_p.gather(-1, labels.clamp(min=0)[:, None])[:, 0].masked_fill(labels < 0, 0.0)
        entropy = -torch.bmm(p[:, None, :], log_p[:, :, None]).flatten()  # Σ p·log p without a third [n, V]
    return log_p, p, token_logprobs, entropy


def _autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on the devices that have it (the meta device, on which the trainer bench
    counts memory, has none)."""
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int,
                temperature: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        n, weight_c = hidden.shape[0], weight.to(dtype)  # one cast for all chunks
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            _, _, logprobs[start:end], entropy[start:end] = _chunk_stats(
                hidden[start:end], weight_c, labels[start:end], temperature, dtype)
        ctx.save_for_backward(hidden, weight, labels, entropy)
        ctx.chunk_tokens, ctx.temperature, ctx.dtype = chunk_tokens, temperature, dtype
        ctx.mark_non_differentiable(labels)
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple:
        hidden, weight, labels, entropy = ctx.saved_tensors
        chunk, temperature, dtype = ctx.chunk_tokens, ctx.temperature, ctx.dtype
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        weight_c = weight.to(dtype)
        for start in range(0, hidden.shape[0], chunk):
            end = min(start + chunk, hidden.shape[0])
            h, y = hidden[start:end], labels[start:end]
            log_p, p, _, _ = _chunk_stats(h, weight_c, y, temperature, dtype)
            # grad_z = g_H·∂H/∂z + g_ℓ·∂ℓ/∂z = −p ⊙ (g_H·(log p + H) + g_ℓ) + g_ℓ·onehot, in log_p's buffer
            g_logprob = (grad_logprobs[start:end].masked_fill(y < 0, 0.0)[:, None] if grad_logprobs is not None
                         else torch.zeros_like(log_p[:, :1]))
            grad_z = log_p
            del log_p  # grad_z owns the buffer: the float32 [n, V] goes when it turns into dtype below
            if grad_entropy is not None:
                grad_z.add_(entropy[start:end, None]).mul_(grad_entropy[start:end, None])
            else:
                grad_z.zero_()
            grad_z.add_(g_logprob).mul_(p).neg_()
            del p
            grad_z.scatter_add_(-1, y.clamp(min=0)[:, None], g_logprob)
            if temperature != 1.0:
                grad_z.div_(temperature)
            grad_z = grad_z.to(dtype)
            if want_hidden:
                grad_hidden[start:end] = grad_z @ weight_c
            if want_weight:
                grad_weight.add_(grad_z.T @ h.to(dtype))  # float32 += one chunk's [V, H] in dtype
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None
