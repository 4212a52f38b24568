"""Seconds per SFT optimizer step of the demo's 4 x 128 model at batch 4, 8, 16, 32 (12 steps each)."""
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from venusrl.demo import demonstrations
from venusrl.env.calculator import CALCULATE_TOOL, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.model.tiny import make_tiny_model
from venusrl.trainer.sft import _IGNORE, _collate, sft_examples
from venusrl.trainer.shared_prefix import causal_lm_logits, common_prefix_length

print("threads", torch.get_num_threads())
base = make_tiny_model(Path("/tmp/i23/tmodel"), hidden=128, layers=4, heads=4, kv_heads=2, rope_theta=10000.0, seed=0)
rows = generate_dataset(256, seed=100, min_steps=1, max_steps=1, max_start=20, max_operand=50)
ex = sft_examples(load_tokenizer(base), demonstrations(rows, 0.0, 100), [CALCULATE_TOOL])
print("len", [len(e.token_ids) for e in ex[:3]], "prefix", common_prefix_length([e.token_ids for e in ex[:8]]))
model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for bs in (4, 8, 16, 32):
    t0 = time.monotonic(); n = 0
    for s in range(12):
        b = ex[s*bs % 200:(s*bs % 200)+bs]
        ids, att, lab = _collate(b)
        p = common_prefix_length([e.token_ids for e in b])
        logits = causal_lm_logits(model, ids, att, p)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=_IGNORE)
        opt.zero_grad(); loss.backward(); opt.step()
    print(bs, (time.monotonic()-t0)/12, flush=True)
