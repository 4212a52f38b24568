#!/bin/bash
# the three cells of the real rollout bench, one after another, at nice -10 (the logs are not kept:
# every figure is in the JSON)
cd "$(dirname "$0")"
V=${VENUSRL:-venusrl}
echo "$(date -u +%H:%M) start kv" >> times.txt
nice -n -10 $V bench rollout --slots-per-engine 1 --test-log-lines 3 --kv-tokens-per-engine 6000 \
    --tool-latency-s 0.05 --repeats 3 --json rollout_full_slots1_log3_kv6000_t50.json > kv.log 2>&1
echo "$(date -u +%H:%M) start tail" >> times.txt
nice -n -10 $V bench rollout --quick --slots-per-engine 1 --max-turns 20 --repeats 3 \
    --json rollout_quick_slots1_maxturns20.json > tail.log 2>&1
echo "$(date -u +%H:%M) start default" >> times.txt
nice -n -10 $V bench rollout --repeats 3 --json rollout_full_default.json > default.log 2>&1
echo "$(date -u +%H:%M) done" >> times.txt
