"""Copy pretraining then SFT: python copy_pretrain.py OUT SEED PRE_STEPS SFT_EPOCHS [LR]"""
import json, sys, time, random, logging
from pathlib import Path
import torch
if __name__ == "__main__":
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from transformers import AutoModelForCausalLM
    from venusrl.config import load_config
    from venusrl.demo import make_splits, demonstrations
    from venusrl.env.calculator import CALCULATE_TOOL
    from venusrl.model.chat import load_tokenizer
    from venusrl.model.tiny import make_tiny_model
    from venusrl.trainer.sft import sft_examples, train_sft, warmup_cosine
    out, seed, pre_steps, epochs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    lr = float(sys.argv[5]) if len(sys.argv) > 5 else 3e-3
    config = load_config("examples/demo.yaml", ["demo.sft_ungraded_fraction=0", "demo.teacher_swap_fraction=0.45",
                                                "data.generate_options.operators=[+, -]", f"run.seed={seed}"])
    d = config.demo
    base = make_tiny_model(out / "model", hidden=d.model_hidden, layers=d.model_layers, heads=d.model_heads,
                           kv_heads=d.model_kv_heads, rope_theta=d.rope_theta, seed=seed)
    tok = load_tokenizer(base)
    alphabet = sorted({t for c in "0123456789+-*/()=.,:; abcdefghijklmnopqrstuvwxyz" for t in tok.encode(c)})
    t0 = time.monotonic()
    torch.manual_seed(seed); rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(pre_steps))
    L, B = 24, 32
    for step in range(pre_steps):
        lead = rng.randint(0, 8)
        rows = []
        for _ in range(B):
            half = [rng.choice(alphabet) for _ in range(L)]
            rows.append([rng.choice(alphabet) for _ in range(lead)] + half + half)
        ids = torch.tensor(rows)
        logits = model(ids).logits[:, -L - 1:-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, -L:].flatten())
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
        if step % 50 == 0 or step == pre_steps - 1:
            print(f"pre step {step} loss {loss.item():.4f} {time.monotonic()-t0:.0f}s", flush=True)
    model.save_pretrained(out / "pre")
    import shutil
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja") or f.name == "special_tokens_map.json":
            shutil.copy(f, out / "pre" / f.name)
    splits = make_splits(config)
    ex = sft_examples(tok, demonstrations(splits.sft, 0.0, d.sft_seed, 0.45), [CALCULATE_TOOL])
    r = train_sft(out / "pre", out / "sft", ex, epochs=epochs, lr=3e-3, batch_size=16, seed=seed, progress=False)
    print(json.dumps({"seed": seed, "pre_steps": pre_steps, "loss": r["loss_per_epoch"], "seconds": time.monotonic() - t0}), flush=True)
