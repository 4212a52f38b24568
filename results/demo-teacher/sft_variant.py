"""SFT variants of the imperfect-teacher warm start: does it learn to copy on every seed?
Run from the repository root; EXTRA="demo.model_hidden=256 ..." adds config overrides.
python sft_variant.py OUT SEED BATCH EPOCHS LR [STAGE1_EPOCHS STAGE1_BATCH]"""
import json, os, sys, time
from pathlib import Path
import torch
if __name__ == "__main__":
    torch.set_num_threads(1)
    import logging; logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from venusrl.config import load_config
    from venusrl.demo import make_splits, demonstrations
    from venusrl.env.calculator import CALCULATE_TOOL
    from venusrl.model.chat import load_tokenizer
    from venusrl.model.tiny import make_tiny_model
    from venusrl.trainer.sft import sft_examples, train_sft
    out, seed, batch, epochs, lr = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    stage1 = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    stage1_batch = int(sys.argv[7]) if len(sys.argv) > 7 else batch
    config = load_config("examples/demo.yaml", ["demo.sft_ungraded_fraction=0", "demo.teacher_swap_fraction=0.45",
                                                "data.generate_options.operators=[+, -]", f"run.seed={seed}",
                                                *os.environ.get("EXTRA", "").split()])
    d = config.demo
    base = make_tiny_model(out / "model", hidden=d.model_hidden, layers=d.model_layers, heads=d.model_heads,
                           kv_heads=d.model_kv_heads, rope_theta=d.rope_theta, seed=seed)
    splits = make_splits(config)
    tok = load_tokenizer(base)
    report = {"seed": seed, "batch": batch, "epochs": epochs, "lr": lr, "stage1": stage1}
    t0 = time.monotonic()
    src = base
    if stage1:
        adds = [r for r in splits.sft if r["operations"] == "+"]
        ex1 = sft_examples(tok, demonstrations(adds, 0.0, d.sft_seed, 0.0), [CALCULATE_TOOL])
        r1 = train_sft(base, out / "stage1", ex1, epochs=stage1, lr=lr, batch_size=stage1_batch, seed=seed, progress=False)
        report["stage1_loss"] = r1["loss_per_epoch"]; src = out / "stage1"
        print("stage1", len(ex1), r1["loss_per_epoch"], time.monotonic() - t0, flush=True)
    ex = sft_examples(tok, demonstrations(splits.sft, 0.0, d.sft_seed, 0.45), [CALCULATE_TOOL])
    r = train_sft(src, out / "sft", ex, epochs=epochs, lr=lr, batch_size=batch, seed=seed, progress=False)
    report["loss"] = r["loss_per_epoch"]; report["seconds"] = time.monotonic() - t0
    print(json.dumps(report), flush=True)
    (out / "report.json").write_text(json.dumps(report))
