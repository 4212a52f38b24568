"""`venusrl sandbox bench`: sandbox density, lifecycle latency and OOM migration figures.

Every figure comes from real sandboxes on real node agents of this machine:
- density.declared: sandboxes one node admits by declared size (native E2B's rule);
- density.actual:   Algorithm 1 on measured memory, each sandbox doing its own setup;
- density.shared:   Algorithm 1 with the template page pool (forks of one zygote);
- oom_kills:        kernel OOM kills in all of the above (must be 0);
- lifecycle_ms:     p50 of create / exec / pause / resume with 32 and 64 sandboxes at once;
- migration.*:      an injected memory burst on a full node: migrations, time from OOM
                    interception to thaw, and whether every file and result survived;
- migration.exactly_once: a non-idempotent command (increment a counter file, then grow
                    until OOM interception migrates it) leaves the counter exactly +1;
                    `exactly_once_detail.snapshot_cost` is what the snapshot adds to a
                    command, on and off in interleaved pairs;
- density_image.*:  the three density runs for an image template (an image built here from
                    this host's files and imported into a fresh store), each sandbox running
                    the image's Python: their roots share the image's read-only layers,
                    stored and paged in once;
- warm_python:      an image template whose Python state lives in the image zygote
                    (python_modules json, decimal): sandbox create with its warm Python
                    ready, against creating a plain image sandbox and running a cold
                    `python3 -c 'import json, decimal; ...'` in it, in interleaved pairs
                    (`--only warm_python` runs this case alone);
- e2b:              create-to-first-command latency through the E2B protocol against our
                    own API, and 32 sandboxes made at once through the e2b SDK with the node's
                    admission and sharing figures (`--only e2b`, alone; sandbox_e2b.py).
A density run fills the node until it refuses for `settle_s` in a row (memory is stable).
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from venusrl.sandbox.api import Sandbox
from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.config import SandboxConfig
from venusrl.sandbox.errors import CapacityError
from venusrl.sandbox.image.build import ImageSpec, LayerTar, host_rootfs, write_oci
from venusrl.sandbox.image.store import ImageStore
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


IMAGE_NAME = "bench-rootfs"
IMAGE_TEMPLATE = Template(name="bench-image", image=IMAGE_NAME)
# Started in each image sandbox as it is created: the image's Python with part of its stdlib
# (file pages of the shared layers, one page cache for all) and private state of its own.
IMAGE_START = ("python3 -c 'import json, decimal, email.parser, http.client, time; "
               f"state = bytearray({PRIVATE_STATE_MIB} << 20); time.sleep(86400)' >/dev/null 2>&1 &")
WARM_MODULES = ("json", "decimal")
WARM_WORK = "json.dumps(str(decimal.Decimal(1) / 7))"  # what a sandbox's Python does once it has the imports
WARM_TEMPLATE = Template(name="bench-image-python", image=IMAGE_NAME, python_modules=WARM_MODULES,
                         python_start=WARM_WORK)
COLD_PYTHON = f"python3 -c 'import {', '.join(WARM_MODULES)}; {WARM_WORK}'"
# Increments a counter, then needs 250 MiB on a 200 MiB node: OOM interception migrates it.
COUNT_THEN_GROW = ("n=$(cat counter); echo $((n + 1)) > counter; "
                   "python3 -c 'b = bytearray(250 << 20)' && echo grown; cat counter")


def build_bench_image(work: Path) -> str:
    """An image of this host's programs and Python, imported into a fresh store under `work`."""
    rootfs = host_rootfs(work / "rootfs")
    (rootfs / "workspace").mkdir()
    image = ImageSpec([LayerTar.from_dir(rootfs)], env=["PATH=/usr/local/bin:/usr/bin:/bin"], working_dir="/workspace")
    store = work / "store"
    ImageStore(store).import_image(write_oci(image, work / "oci", ref=IMAGE_NAME))
    return str(store)


def fill_node(config: SandboxConfig, budget: int, settle_s: float, limit: int,
              template: Template = BENCH_TEMPLATE, start: str | None = None) -> dict[str, Any]:
    """Create sandboxes on one node until it refuses for `settle_s` (each running `start`
    when given); report what it holds."""
    cluster = LocalCluster(config, budgets=[budget])
    try:
        controller = cluster.controller
        admitted: list[str] = []
        refused_since: float | None = None
        while len(admitted) < limit:
            try:
                admitted.append(controller.create(template, group_id="bench",
                                                  memory_limit=int(config.memory_limit)))
                refused_since = None
                if start is not None:
                    controller.run(admitted[-1], start, timeout=30)
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
                "oom_events": status["oom_events"], "per_sandbox_mib": _per_sandbox(controller, admitted[:SAMPLED])}
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


def exactly_once(config: SandboxConfig, template: Template) -> dict[str, Any]:
    """COUNT_THEN_GROW in a sandbox on a 200 MiB node beside a 1 GiB one: is the counter +1?"""
    cluster = LocalCluster(config, budgets=[200 * MiB, 1024 * MiB])
    try:
        c = cluster.controller
        sid = c.create(template, node_id="node-0", memory_limit=512 * MiB)
        c.write(sid, "counter", _b64("41\n"))
        result = c.run(sid, COUNT_THEN_GROW, timeout=120)
        counter = _unb64(c.read(sid, "counter")["data"])
        moved = c.routes[sid].node_id == "node-1"  # oom_records lag: appended after the thaw
        oom_kills = sum(n.call("status")["oom_kills"] for n in c.nodes.values())
        return {"exactly_once": result["exit_code"] == 0 and counter == "42\n" and moved,
                "oom_kills": oom_kills, "moved_to": c.routes[sid].node_id,
                "oom_events": c.nodes["node-0"].call("status")["oom_events"],
                "counter_before": 41, "counter_after": int(counter),
                "exit_code": result["exit_code"], "template": template.name}
    finally:
        cluster.close()


def snapshot_cost(store: str, repeats: int) -> dict[str, Any]:
    """What exactly-once costs a command: `true` in an image sandbox with the layer snapshot
    on and off, in interleaved pairs, over an empty writable layer and over 64 MiB of
    written files (the snapshot copies the layer, so it grows with what the sandbox wrote)."""
    clusters = {once: LocalCluster(SandboxConfig(exactly_once=once, image_store=store), budgets=[1024 * MiB])
                for once in (True, False)}
    try:
        sandboxes = {once: cluster.controller.create(IMAGE_TEMPLATE) for once, cluster in clusters.items()}
        figures: dict[str, Any] = {}
        for case, setup in (("empty_layer", None), ("layer_64mib", "head -c 67108864 /dev/zero > /workspace/blob")):
            timings: dict[bool, list[float]] = {True: [], False: []}
            for once, sid in sandboxes.items():
                if setup is not None:
                    clusters[once].controller.run(sid, setup, timeout=60)
            for _ in range(repeats):
                for once, sid in sandboxes.items():
                    started = time.perf_counter()
                    clusters[once].controller.run(sid, "true", timeout=30)
                    timings[once].append((time.perf_counter() - started) * 1000)
            figures[case] = {("on" if once else "off"): _spread(values) for once, values in timings.items()}
        return {**figures, "repeats": repeats, "pairs": "interleaved"}
    finally:
        for cluster in clusters.values():
            cluster.close()


def warm_python(store: str, repeats: int) -> dict[str, Any]:
    """Create-to-ready of a sandbox whose Python is forked from the warmed image zygote,
    against a plain image sandbox plus a cold interpreter doing the same imports and work,
    in interleaved pairs on one node; both templates' zygotes start before the timing."""
    # Admission by declared size: two 128 MiB sandboxes at a time always fit, so no
    # growth estimate refuses or delays one side of a pair.
    config = SandboxConfig(image_store=store, admission="declared", memory_limit=128 * MiB)
    cluster = LocalCluster(config, budgets=[1024 * MiB])
    try:
        c = cluster.controller
        for template in (WARM_TEMPLATE, IMAGE_TEMPLATE):
            c.kill(c.create(template))
        timings: dict[str, list[float]] = {"warm_create": [], "plain_create": [], "cold_python": [], "cold_total": [],
                                        "command_true": []}
        for index in range(repeats):
            started = time.perf_counter()
            warm = c.create(WARM_TEMPLATE)
            timings["warm_create"].append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            plain = c.create(IMAGE_TEMPLATE)
            created = time.perf_counter()
            ran = c.run(plain, COLD_PYTHON, timeout=60)
            done = time.perf_counter()
            if ran["exit_code"] != 0:
                raise RuntimeError(f"cold python failed: {ran['stderr'][-300:]}")
            before_true = time.perf_counter()
            c.run(plain, "true", timeout=60)  # what any command costs: the session's bash round trip
            timings["command_true"].append((time.perf_counter() - before_true) * 1000)
            timings["plain_create"].append((created - started) * 1000)
            timings["cold_python"].append((done - created) * 1000)
            timings["cold_total"].append((done - started) * 1000)
            c.kill(warm)
            c.kill(plain)
            log.info("warm python pair %d/%d: warm %.0f ms, plain + cold %.0f ms", index + 1, repeats,
                     timings["warm_create"][-1], timings["cold_total"][-1])
        saved = [cold - warm for warm, cold in zip(timings["warm_create"], timings["cold_total"], strict=True)]
        return {**{name: _spread(values) for name, values in timings.items()}, "cold_minus_warm": _spread(saved),
                "warm_faster_pairs": sum(s > 0 for s in saved), "repeats": repeats, "pairs": "interleaved",
                "modules": list(WARM_MODULES), "work": WARM_WORK, "cold_command": COLD_PYTHON}
    finally:
        cluster.close()


def _spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4)
    return {"p50_ms": round(statistics.median(values), 2), "p25_ms": round(q[0], 2), "p75_ms": round(q[2], 2)}


SAMPLED = 16  # sandboxes whose processes' RSS / PSS / USS are read per density run


def _per_sandbox(controller, sandbox_ids: list[str]) -> dict[str, float]:
    """Mean memory of one sandbox: charged to its cgroup, and of its processes RSS (all the
    pages they map), PSS (shared pages split among their sharers) and USS (their own).
    RSS - USS is what sharing (zygote pages, image layers' page cache) saves each sandbox."""
    if not sandbox_ids:
        return {}
    samples = [controller.metrics(sid) for sid in sandbox_ids]
    return {key: round(statistics.mean(s[f"{key}_bytes"] for s in samples) / MiB, 2)
            for key in ("cgroup", "rss", "pss", "uss")}


def _image_figures(store: str) -> dict[str, Any]:
    """How much the image's layers hold: stored (and cached) once, whatever the sandbox count."""
    layers = [json.loads(p.read_text()) for p in ImageStore(store).layers_dir.glob("*.json")]
    return {"layers": len(layers), "layer_mib": round(sum(entry["bytes"] for entry in layers) / MiB, 1),
            "layer_files": sum(entry["files"] for entry in layers), "copies_stored": 1}


def _b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def _unb64(data: str) -> str:
    import base64

    return base64.b64decode(data).decode()


def density(runs: dict[str, SandboxConfig], node_memory: int, settle_s: float, limit: int,
            template: Template, start: str | None) -> dict[str, Any]:
    details = {}
    for name, config in runs.items():
        log.info("density run %s (template %s)", name, template.name)
        details[name] = fill_node(config, node_memory, settle_s, limit, template, start)
        log.info("density %s: %s", name, details[name])
    counts = {name: details[name]["alive"] for name in runs}
    ratio = round(counts["shared"] / max(1, counts["declared"]), 2)
    return {**counts, "details": details, "shared_over_declared": ratio, "target_ratio": 9.0,
            "meets_target": ratio >= 9.0}


ALONE = ("warm_python", "e2b")  # the cases `--only` runs by themselves


def run_bench(quick: bool, node_memory: int, declared: int, out: Path | None,
              only: str | None = None) -> dict[str, Any]:
    if only == "e2b":
        from venusrl.bench.sandbox_e2b import run_e2b_bench

        results = {"config": {"quick": quick, "only": only}, "e2b": run_e2b_bench(quick)}
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2))
        return results
    if only == "warm_python":
        work = Path(tempfile.mkdtemp(prefix="vrl-bench-image-"))
        try:
            results = {"config": {"quick": quick, "only": only},
                       "warm_python": warm_python(build_bench_image(work), repeats=10 if quick else 30)}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if out is not None:
            out.write_text(json.dumps(results, indent=2))
        return results
    if only is not None:
        raise ValueError(f"--only: {only!r} is not a case this bench runs alone ({', '.join(ALONE)})")
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
    results["density"] = density(runs, node_memory, settle_s, limit, BENCH_TEMPLATE, None)
    work = Path(tempfile.mkdtemp(prefix="vrl-bench-image-"))
    try:
        store = build_bench_image(work)
        image_runs = {name: config.model_copy(update={"image_store": store}) for name, config in runs.items()}
        results["density_image"] = density(image_runs, node_memory, settle_s, limit, IMAGE_TEMPLATE, IMAGE_START)
        results["density_image"]["image"] = _image_figures(store)
        # No host-interpreter state in an image template: `shared` differs from `actual` only
        # by the zygote, and both share the image's layers and their page cache.
        results["config"]["image_template"] = {"image": IMAGE_NAME, "start": IMAGE_START,
                                               "private_state_mib": PRIVATE_STATE_MIB}
        once = exactly_once(SandboxConfig(admission="dynamic", share_pages=True, cold_start_default=32 * MiB,
                                          image_store=store, **base), IMAGE_TEMPLATE)
        log.info("exactly-once snapshot cost")
        once["snapshot_cost"] = snapshot_cost(store, repeats=10 if quick else 30)
        log.info("warm python from the image zygote")
        results["warm_python"] = warm_python(store, repeats=10 if quick else 30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
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
    results["migration"]["exactly_once"] = once.pop("exactly_once")
    results["migration"]["exactly_once_detail"] = once
    results["oom_kills"] = (sum(d["oom_kills"] for case in ("density", "density_image")
                                for d in results[case]["details"].values())
                            + results["migration"]["oom_kills"] + once["oom_kills"])
    if out is not None:
        out.write_text(json.dumps(results, indent=2))
    return results
