"""Seconds (wall and CPU) of one quick table1 case, batch 16, under the system named in argv[1];
CPU time is the figure to compare on a shared machine. Prints wall, CPU, throughput."""
import sys
import time

from venusrl.sim.scenarios import table1
from venusrl.sim.run import simulate
from venusrl.sim.workload import WorkloadConfig
case = next(iter(table1(True, WorkloadConfig())))
spec = [s for s in case.specs if s.system.name == sys.argv[1]][0]
t0, c0 = time.perf_counter(), time.process_time()
r = simulate(spec)
print(f"{time.perf_counter()-t0:.2f} wall {time.process_time()-c0:.2f} cpu {r.throughput_tokens_per_s}")
