import json, sys, collections
for f in sys.argv[1:]:
    d = json.load(open(f)); S = d["samples"]; steps = d["result"]["step_times"]
    print(f, steps)
    # per step window, fraction of engine-samples idle, and idle classification
    bounds = [0] + steps
    for k in range(len(steps)):
        win = [s for s in S if bounds[k] <= s["t"] < bounds[k+1]]
        c = collections.Counter(); n = 0
        for s in win:
            for e in s["e"]:
                n += 1
                if e["busy"]: c["busy"] += 1; continue
                if e.get("waiting_slot",0): c["idle_with_waiting_slot"] += 1
                elif e.get("generating",0): c["idle_gen?"] += 1
                elif e.get("in_tool",0): c["idle_all_in_tool"] += 1
                elif e.get("moving",0): c["idle_moving"] += 1
                else: c["idle_empty"] += 1
        live = sum(sum(v for kk, v in e.items() if kk in ("waiting_slot","generating","in_tool","moving")) for s in win for e in s["e"]) / max(1,n)
        gen = sum(e.get("generating",0) for s in win for e in s["e"]) / max(1,n)
        print(f"  step {k+1} [{bounds[k]:.0f},{bounds[k+1]:.0f}) " + " ".join(f"{kk}={v/n:.3f}" for kk, v in sorted(c.items())) + f" live/eng={live:.1f} gen/eng={gen:.1f}")
