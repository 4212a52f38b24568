"""One side's engine throughput on the quick bench's case (tiny model of BENCH_SHAPE, batch 8,
64 + 32 tokens, greedy): min wall and min CPU seconds over 5 generates, torch on 1 thread."""
import json, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from venusrl.bench.engine import BENCH_SHAPE
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.model.checkpoint import load_model
from venusrl.model.tiny import make_tiny_model
from venusrl.types import SamplingParams
with tempfile.TemporaryDirectory() as tmp:
    model_dir = make_tiny_model(Path(tmp) / "model", **BENCH_SHAPE)
    model = load_model(model_dir)
    prompts = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_new_tokens=32, temperature=0, stop_token_ids=(-1,))
    walls, cpus = [], []
    for _ in range(6):
        engine = Engine(model, EngineConfig(kv_capacity_tokens=8 * 96 * 2, max_running_requests=8, max_prefill_tokens=512))
        w, c = time.perf_counter(), time.process_time()
        out = engine.generate(prompts, params)
        walls.append(time.perf_counter() - w); cpus.append(time.process_time() - c)
    print(json.dumps({"wall_s": min(walls[1:]), "cpu_s": min(cpus[1:]), "tokens": [o.output_ids[:4] for o in out][:2]}))
