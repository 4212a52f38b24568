"""Compare two `venusrl simulate --json` outputs, leaving out wall-clock fields."""
import json, sys
WALL = {"wall_s", "events_per_s"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in WALL}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = strip(a) == strip(b)
print("identical (wall-clock fields aside)" if same else "DIFFERENT")
def walls(d):
    return [(c["label"], r["name"], r["wall_s"], r["events_per_s"]) for c in d["cases"] for r in c["runs"]]
for (label, name, wa, ea), (_, _, wb, eb) in zip(walls(a), walls(b)):
    print(f"{json.dumps(label)} {name}: wall {wa} -> {wb} s, events/s {ea} -> {eb}")
sys.exit(0 if same else 1)
