import asyncio, sys, time, tempfile, json
from dataclasses import replace
from pathlib import Path
import torch
from venusrl.bench import rollout as b
from venusrl.coordinator.config import PredictorConfig
from venusrl.coordinator.predictors import make_predictor
from venusrl.model.tiny import make_tiny_model
torch.set_num_threads(1)
case = b.FULL
variants = sys.argv[1].split(",")
with tempfile.TemporaryDirectory() as tmp:
    md = make_tiny_model(Path(tmp)/"m", seed=1)
    batch_s, train = b._calibrate(md, case) if any("pred" in v for v in variants) else (0, [])
    if train:
        lp = make_predictor(PredictorConfig(kind="learned")); lp.fit(train); lp.save(Path(tmp)/"p.pkl")
    for v in variants:
        mode = v.split(":")[0]
        if v.endswith(":tiers"):
            b.SETUPS["action_level_t"] = replace(b.SETUPS["action_level"], cache_policy="tiers", demotion=True); mode = "action_level_t"
        pred = b.RecordingPredictor(make_predictor(PredictorConfig(kind="learned", path=str(Path(tmp)/"p.pkl"), refit_every=10**9))) if v.endswith(":pred") else None
        t = time.perf_counter()
        r = asyncio.run(b._round(md, case, mode, 0.0, b.tasks(case, 0), pred))
        if pred: pred.close()
        f = r.figures
        print(v, "last %.2f" % f["time_to_last_step_s"], "first %.2f" % f["time_to_first_batch_s"], "pre", f["preemptions"], "mig", f["migrations"], "sampled", f["tokens"]["sampled"], "busy %.1f" % sum(s.seconds for s in r.samples), "steps", len(r.samples), flush=True)
