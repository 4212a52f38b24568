"""Decoder building blocks. Parameter names match Hugging Face's Qwen3/Qwen2/Llama modules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from venusrl.model.args import ModelArgs
from venusrl.model.attention import AttentionContext
from venusrl.model.rope import apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = args.num_attention_heads
        self.num_kv_heads = args.num_key_value_heads
        self.head_dim = args.head_dim
        bias = args.attention_bias
        self.q_proj = nn.Linear(args.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, args.hidden_size, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = context.attend(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(batch, seq, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        bias = args.mlp_bias
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_idx: int):
        super().__init__()
        self.self_attn = Attention(args, layer_idx)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context)
        return x + self.mlp(self.post_attention_layernorm(x))
