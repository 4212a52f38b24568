"""Decoder-only causal LM for the Qwen3 family, and Qwen2/Llama through the same code."""

from __future__ import annotations

import torch
from torch import nn

from venusrl.model.args import ModelArgs
from venusrl.model.attention import AttentionContext, CausalAttention
from venusrl.model.layers import DecoderLayer, RMSNorm
from venusrl.model.rope import RotaryEmbedding

_PLAIN_CAUSAL = CausalAttention()


class Decoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_hidden_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(args)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, context: AttentionContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, signed_sin = self.rotary_emb(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, signed_sin, context)
        return self.norm(x)


class CausalLM(nn.Module):
    """`forward(input_ids[B, T]) -> logits[B, T, V]`.

    `positions` default to 0..T-1 per row. `context` owns the KV: None means plain causal
    attention within the batch (training, scoring); a cache or the engine's paged pool
    otherwise.
    """

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        context: AttentionContext | None = None,
    ) -> torch.Tensor:
        return self.lm_head(self.hidden_states(input_ids, positions, context))

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        context: AttentionContext | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states [B, T, H]; a caller that needs logits at a few positions
        applies `lm_head` to those rows only."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self.model(input_ids, positions, context or _PLAIN_CAUSAL)

    def fuse_projections(self) -> None:
        """Run q/k/v and gate/up as one matmul each (inference engines call this once the
        weights are on their device; see `layers.fuse_linears`)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def reset_rope(self) -> None:
        """Recompute the RoPE buffer (it is not stored in checkpoints)."""
        device = self.model.embed_tokens.weight.device
        self.model.rotary_emb = RotaryEmbedding(self.args).to(device)
