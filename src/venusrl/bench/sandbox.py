"""`venusrl sandbox bench`: sandbox density, lifecycle latency and OOM migration figures.

Every figure comes from real sandboxes on real node agents of this machine:
- density.declared: sandboxes one node admits by declared size (native E2B's rule);
- density.actual:   Algorithm 1 on measured memory, each sandbox doing its own setup;
- density.shared:   Algorithm 1 with the template page pool (forks of one zygote);
- oom_kills:        kernel OOM kills in all of the above (must be 0);
- lifecycle_ms:     p50 of create / exec / pause / resume with 32 and 64 sandboxes at once;
- migration.*:      an injected memory burst on a full node: migrations, time from OOM
                    interception to thaw, and whether every file and result survived.
A density run fills the node until it refuses for `settle_s` in a row (memory is stable).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.config import SandboxConfig
from venusrl.sandbox.errors import CapacityError
from venusrl.sandbox.template import Template

log = logging.getLogger(__name__)

MiB = 1 << 20
SHARED_STATE_MIB = 64  # read-only state every sandbox of the template maps
PRIVATE_STATE_MIB = 4  # state each sandbox writes for itself

BENCH_TEMPLATE = Template(
    name="bench-numpy",
    python_modules=("numpy",),
    python_setup=f"STATE = numpy.ones({SHARED_STATE_MIB} << 17)  # {SHARED_STATE_MIB} MiB of float64, touched",
    python_start=(f"PRIVATE = numpy.ones({PRIVATE_STATE_MIB} << 17)\n"
                  "CHECKSUM = float(STATE.sum())  # reads the shared state"),
)


def fill_node(config: SandboxConfig, budget: int, settle_s: float, limit: int) -> dict[str, Any]:
    """Create sandboxes on one node until it refuses for `settle_s`; report what it holds."""
    cluster = LocalCluster(config, budgets=[budget])
    try:
        controller = cluster.controller
        admitted: list[str] = []
        refused_since: float | None = None
        while len(admitted) < limit:
            try:
                admitted.append(controller.create(BENCH_TEMPLATE, group_id="bench",
                                                  memory_limit=int(config.memory_limit)))
                refused_since = None
            except CapacityError:
                now = time.monotonic()
                refused_since = refused_since or now
                if now - refused_since >= settle_s:
                    break
                time.sleep(config.control_interval_s)
        alive = sum(1 for sid in admitted if controller.run(sid, "echo ok", timeout=30)["stdout"] == "ok\n")
        status = next(iter(controller.nodes.values())).call("status")
        return {"admitted": len(admitted), "alive": alive, "m_used_mib": round(status["m_used"] / MiB, 1),
                "threshold": round(status["threshold"], 3), "oom_kills": status["oom_kills"],
                "oom_events": status["oom_events"]}
    finally:
        cluster.close()


def lifecycle(config: SandboxConfig, budget: int, concurrency: int) -> dict[str, float]:
    """p50 latency (ms) of each operation with `concurrency` sandboxes doing it at once.
    A create the node refuses for now is retried, as a caller would; its latency counts
    from the first attempt."""
    cluster = LocalCluster(config, budgets=[budget])
    timings: dict[str, list[float]] = {"create": [], "exec": [], "pause": [], "resume": []}
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency, timeout=300)

    def timed(op: str, fn):
        started = time.perf_counter()
        result = fn()
        with lock:
            timings[op].append((time.perf_counter() - started) * 1000)
        return result

    def create() -> Sandbox:
        while True:
            try:
                return Sandbox.create(cluster.controller, BENCH_TEMPLATE, group_id="life")
            except CapacityError:
                time.sleep(config.control_interval_s)

    def one(_: int) -> None:
        try:
            barrier.wait()
            sandbox = timed("create", create)
            barrier.wait()
            timed("exec", lambda: sandbox.run("echo hi"))
            barrier.wait()
            timed("pause", sandbox.pause)
            barrier.wait()
            timed("resume", sandbox.resume)
            sandbox.kill()
        except threading.BrokenBarrierError:
            raise
        except BaseException:
            log.exception("lifecycle: one sandbox failed")
            barrier.abort()  # the others fail fast instead of waiting forever
            raise

    try:
        # The pool starts and the template's cold start is profiled outside the timings.
        warm = cluster.controller.create(BENCH_TEMPLATE, group_id="warm")
        time.sleep(config.cold_start_s + 2 * config.control_interval_s)
        cluster.controller.kill(warm)
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(concurrency)))
    finally:
        cluster.close()
    return {op: round(statistics.median(values), 2) for op, values in timings.items()}


def migration(config: SandboxConfig, budget: int, sandboxes: int, burst_mib: int) -> dict[str, Any]:
    """Fill a node, then make two sandboxes burst past its budget at once."""
    cluster = LocalCluster(config, budgets=[budget, 4 * budget])
    try:
        c = cluster.controller
        ids = [c.create(BENCH_TEMPLATE, node_id="node-0", memory_limit=int(config.memory_limit)) for _ in range(sandboxes)]
        for i, sid in enumerate(ids):
            c.write(sid, f"work/file-{i}.txt", _b64(f"payload {i} " * 100))
            c.run(sid, f"mkdir -p /tmp/s{i} && cd /tmp/s{i} && export SANDBOX_INDEX={i}")
        burst = f"python3 -c 'import time; b = bytearray({burst_mib} << 20); time.sleep(0.5)' && echo $SANDBOX_INDEX"
        results: dict[str, Any] = {}

        def run_burst(sid: str) -> None:
            results[sid] = c.run(sid, burst, timeout=120)

        threads = [threading.Thread(target=run_burst, args=(sid,)) for sid in ids[:2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        delivered = all(results[sid]["exit_code"] == 0 and results[sid]["stdout"] == f"{ids.index(sid)}\n"
                        for sid in ids[:2])
        intact = True
        for i, sid in enumerate(ids):
            text = _unb64(c.read(sid, f"work/file-{i}.txt")["data"])
            session = c.run(sid, "pwd; echo $SANDBOX_INDEX")["stdout"]
            intact &= text == f"payload {i} " * 100 and session == f"/tmp/s{i}\n{i}\n"
        moves = [m for r in c.oom_records for m in r.migrations]
        oom_kills = sum(n.call("status")["oom_kills"] for n in c.nodes.values())
        return {"count": len(moves), "oom_events": len(c.oom_records),
                "recover_s": round(max((r.seconds for r in c.oom_records), default=0.0), 3),
                "per_migration_s": [round(m.seconds, 3) for m in moves],
                "moved_mib": [round(m.bytes / MiB, 1) for m in moves],
                "files_intact": intact, "results_delivered": delivered, "oom_kills": oom_kills}
    finally:
        cluster.close()


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def _unb64(data: str) -> str:
    import base64

    return base64.b64decode(data).decode()


def run_bench(quick: bool, node_memory: int, declared: int, out: Path | None) -> dict[str, Any]:
    settle_s = 2.0 if quick else 5.0
    limit = 600
    base = dict(memory_limit=declared, node_memory=node_memory)
    results: dict[str, Any] = {
        "config": {"quick": quick, "node_memory_mib": node_memory // MiB, "declared_mib": declared // MiB,
                   "template": {"imports": ["numpy"], "shared_state_mib": SHARED_STATE_MIB,
                                "private_state_mib": PRIVATE_STATE_MIB},
                   "alpha": SandboxConfig().alpha, "reaction_time_s": SandboxConfig().reaction_time_s,
                   "min_headroom": SandboxConfig().min_headroom, "lifecycle_node_mib": 4096},
    }
    runs = {
        "declared": SandboxConfig(admission="declared", share_pages=True, **base),
        "actual": SandboxConfig(admission="dynamic", share_pages=False, **base),
        "shared": SandboxConfig(admission="dynamic", share_pages=True, **base),
    }
    details = {}
    for name, config in runs.items():
        log.info("density run %s", name)
        details[name] = fill_node(config, node_memory, settle_s, limit)
        log.info("density %s: %s", name, details[name])
    density = {name: details[name]["alive"] for name in runs}
    results["density"] = {**density, "details": details,
                          "shared_over_declared": round(density["shared"] / max(1, density["declared"]), 2),
                          "target_ratio": 9.0}
    results["density"]["meets_target"] = results["density"]["shared_over_declared"] >= 9.0
    lifecycle_config = SandboxConfig(admission="dynamic", share_pages=True, **base)
    results["lifecycle_ms"] = {}
    for concurrency in (32, 64):
        log.info("lifecycle with %d concurrent sandboxes", concurrency)
        results["lifecycle_ms"][str(concurrency)] = lifecycle(lifecycle_config, 4 << 30, concurrency)
    log.info("injected memory burst")
    # Two bursts that together overflow the node, each within its sandbox's declared size
    # (past that, the sandbox's own limit would rightly kill it).
    migration_budget = 512 * MiB if quick else 768 * MiB
    burst_mib = min(declared // MiB - 64, int(migration_budget // MiB * 0.45))
    results["config"]["migration"] = {"node_mib": migration_budget // MiB, "target_node_mib": 4 * migration_budget // MiB,
                                      "sandboxes": 6, "bursts": 2, "burst_mib": burst_mib}
    results["migration"] = migration(SandboxConfig(admission="dynamic", share_pages=True,
                                                   cold_start_default=32 * MiB, **base),
                                     migration_budget, sandboxes=6, burst_mib=burst_mib)
    results["oom_kills"] = sum(d["oom_kills"] for d in details.values()) + results["migration"]["oom_kills"]
    if out is not None:
        out.write_text(json.dumps(results, indent=2))
    return results
