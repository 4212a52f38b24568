"""Scheduler iterations per second on a multi-turn workload (no runner: tokens drawn at random)."""
import random, sys, time
from venusrl.engine.config import EngineConfig
from venusrl.engine.scheduler import Scheduler
from venusrl.types import Priority, SamplingParams

def run(seed=0, iterations=4000):
    rng = random.Random(seed)
    s = Scheduler(EngineConfig(page_size=16, kv_capacity_tokens=32768, max_running_requests=64,
                               max_prefill_tokens=4096, chunked_prefill_size=1024, demotion=True,
                               host_kv_capacity_tokens=16384))
    histories = {f"t{i}": [i % 8] * 600 for i in range(128)}
    serial = 0
    start = time.perf_counter()
    for it in range(iterations):
        busy = {r.trajectory_id for r in s.requests.values()}
        for traj in rng.sample(sorted(histories), 4):
            if traj not in busy and len(s.requests) < 96:
                serial += 1
                histories[traj] = histories[traj][-8000:] + [rng.randrange(50) for _ in range(rng.randrange(20, 200))]
                s.add_request(f"r{serial}", histories[traj], SamplingParams(max_new_tokens=rng.randrange(20, 200)),
                              Priority(rng.randrange(3)), traj)
        if it % 50 == 0:
            s.set_priority(rng.choice(sorted(histories)), Priority(rng.randrange(3)))
        batch = s.schedule()
        sampled = {i.request_id: rng.randrange(1000) for i in batch.items if i.sample}
        for out in s.on_batch_done(batch, sampled):
            histories[out.trajectory_id] = out.prompt_ids + out.output_ids
    elapsed = time.perf_counter() - start
    st = s.stats()
    return iterations / elapsed, (st.prompt_tokens, st.cached_tokens, st.retractions, st.demotions, st.recomputed_tokens)

rate, figures = run()
print(f"{rate:.1f} {figures}")
