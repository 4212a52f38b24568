"""One simulated run in one process (the patch's atexit hook appends its averages to
stall_diag.jsonl beside this script; a pool worker would skip it): SYSTEM MODEL BATCH SEED."""
import sys, logging, os
from pathlib import Path
from venusrl.sim.run import simulate
from venusrl.sim.scenarios import fig10_cell
logging.disable(logging.INFO)
system, model, batch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.environ["DIAG_TAG"] = f"{system} {model} {batch} {seed}"
os.environ["DIAG_OUT"] = str(Path(__file__).with_name("stall_diag.jsonl"))
r = simulate(fig10_cell(system, model, batch, seed=seed)).to_dict()
print(system, model, batch, seed, r["sim_seconds"], r["engine"]["memory_stalls"])
