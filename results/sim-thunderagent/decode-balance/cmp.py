import json, sys, collections, statistics
rows = [json.loads(l) for l in open(str(__import__("pathlib").Path(__file__).with_name("runs.jsonl")))]
by = collections.defaultdict(dict)
for r in rows: by[(r["tag"], r["model"], r["batch"])][r["seed"]] = r["t"]
for (tag, m, b), d in by.items():
    ta = by.get(("ta", m, b), {}); ve = by.get(("venus", m, b), {})
    seeds = sorted(d)
    vt = [ta[s]/d[s] for s in seeds if s in ta]; vv = [ve[s]/d[s] for s in seeds if s in ve]
    print(f"{tag:14s} {m} b{b} " + " ".join(f"{d[s]:7.0f}" for s in seeds) + "  /TA " + " ".join(f"{x:.3f}" for x in vt) + f"  gm {statistics.geometric_mean(vt) if vt else 0:.3f}  vs venus gm {statistics.geometric_mean(vv) if vv else 0:.3f}")
