"""SFT with a checkpoint per epoch: python sft_per_epoch.py OUT N_EXAMPLES BATCH LR EPOCHS MAX_STEPS [hidden layers]"""
import sys, time, random, torch, json
from pathlib import Path
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
from venusrl.demo import demonstrations
from venusrl.env.calculator import CALCULATE_TOOL, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.model.tiny import make_tiny_model
from venusrl.trainer.sft import sft_examples, _collate, _length_grouped_batches, warmup_cosine, _save, _IGNORE
from venusrl.trainer.shared_prefix import common_prefix_length, causal_lm_logits
out = Path(sys.argv[1]); n, bs, lr, epochs, max_steps = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
hidden, layers = (int(sys.argv[7]), int(sys.argv[8])) if len(sys.argv) > 8 else (128, 4)
base = make_tiny_model(out / "model", hidden=hidden, layers=layers, heads=4, kv_heads=2, rope_theta=10000.0, seed=0)
rows = generate_dataset(n, seed=100, min_steps=1, max_steps=max_steps, max_start=20, max_operand=50)
ex = sft_examples(load_tokenizer(base), demonstrations(rows, 0.0, 100), [CALCULATE_TOOL])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).train()
opt = torch.optim.AdamW(model.parameters(), lr=lr)
rng = random.Random(0); lengths = [len(e.token_ids) for e in ex]
spe = -(-len(ex) // bs)
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(epochs * spe))
t0 = time.monotonic()
for epoch in range(1, epochs + 1):
    ls, nt = 0.0, 0
    for batch in _length_grouped_batches(lengths, bs, rng):
        ids, att, lab = _collate([ex[i] for i in batch])
        p = common_prefix_length([ex[i].token_ids for i in batch])
        logits = causal_lm_logits(model, ids, att, p)
        c = int((lab[:, 1:] != _IGNORE).sum())
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), lab[:, 1:].flatten(), ignore_index=_IGNORE)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
        ls += loss.item() * c; nt += c
    _save(model, base, out / f"sft-e{epoch}")
    print(f"epoch {epoch} loss {ls/nt:.4f} t {time.monotonic()-t0:.0f}s", flush=True)
