"""Sample each engine's state every DT simulated seconds in one quick cell.
   PYTHONPATH=src python results/sim-thunderagent/decode-balance/probe.py MODEL BATCH SEED PRESET OUT.json [key=value ...]"""
import json, sys, time, collections
import yaml
from venusrl.sim import worker as W
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell
model, batch, seed, preset, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
extra = {a.split('=',1)[0]: yaml.safe_load(a.split('=',1)[1]) for a in sys.argv[6:]}
spec = fig10_cell(preset, model, batch, settings=extra, seed=seed)
DT = 2.0
samples = []
orig_start = W.SimWorker.start
def start(self):
    orig_start(self)
    def sample():
        now = self.loop.now
        rows = []
        for i, e in enumerate(self.engines):
            phases = collections.Counter()
            for t in self.live.values():
                if self.core.engine_of.get(t.id) == i:
                    phases[t.phase.value] += 1
            s = e.scheduler
            rows.append({"busy": e._running, "run": len(s.running) if hasattr(s, "running") else None,
                         "wait": len(s.waiting), **phases})
        samples.append({"t": now, "v": self.engines[0].weight_version, "e": rows,
                        "ready": self.coordinator.counts.ready})
        self.loop.after(DT, sample)
    self.loop.after(0.0, sample)
W.SimWorker.start = start
t0 = time.time()
r = simulate(spec).to_dict()
json.dump({"result": r, "samples": samples}, open(out, "w"))
print(preset, r["sim_seconds"], r["step_times"], r["engine"]["busy_fraction"], time.time() - t0)
