#!/bin/bash
# Paired, interleaved: old (fb253a5) vs new scheduler, CPU seconds of one simulator case and
# scheduler iterations/s of a synthetic multi-turn workload.
cd "$(dirname "$0")/../.."  # the repository root
: "${OLD_SRC:?set OLD_SRC to the src/ of a checkout of fb253a5}"
for i in 1 2 3 4 5; do
  for side in old new; do
    if [ $side = old ]; then P=$OLD_SRC; else P=$PWD/src; fi
    sim=$(PYTHONPATH=$P "${PYTHON:-python}" results/sched-split/sim_case_cpu.py +migration 2>/dev/null)
    loop=$(PYTHONPATH=$P "${PYTHON:-python}" results/sched-split/scheduler_loop.py 2>/dev/null)
    echo "$i $side sim: $sim | loop: $loop"
  done
done
