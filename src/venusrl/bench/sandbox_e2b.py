"""`venusrl bench sandbox --only e2b`: what the E2B protocol costs, and E2B-made sandboxes
at density.

- create_to_first_command: create a sandbox and run its first command (`echo ready`), through
  the real `e2b` SDK against the E2B service (HTTP, Connect streaming, our process table)
  and through venusrl's own API (`venusrl.sandbox.api.Sandbox`, in process), in interleaved
  pairs whose order alternates, on one node; p25/p50/p75 of each and of the paired
  difference. Creation and the first command are also reported apart.
- concurrent: N sandboxes created at once through the SDK, each running a command, with the
  node agent's admission figures beside them (memory used against the Algorithm 1
  threshold, G_active, sandboxes admitted, OOM kills) and the sharing figures of the
  template page pool (mean RSS, PSS and USS of a sandbox's processes: RSS - USS is what
  sharing saves each one).
"""

from __future__ import annotations

import logging
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from venusrl.sandbox.api import Sandbox as OwnSandbox
from venusrl.sandbox.cluster import LocalCluster
from venusrl.sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

MiB = 1 << 20
NODE_BYTES = 4 << 30
FIRST_COMMAND = "echo ready"


def _quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"p25_ms": round(q[0], 2), "p50_ms": round(statistics.median(values), 2), "p75_ms": round(q[2], 2),
            "n": len(values)}


def _sdk():
    try:
        import e2b
    except ImportError:
        raise ValueError("--only e2b: the e2b SDK is not installed (it is in venusrl's dev extra)") from None
    return e2b


def _own(controller) -> tuple[float, float]:
    started = time.perf_counter()
    sandbox = OwnSandbox.create(controller)
    created = time.perf_counter()
    result = sandbox.run(FIRST_COMMAND)
    done = time.perf_counter()
    assert result.stdout == "ready\n", result
    sandbox.kill()
    return (created - started) * 1000, (done - created) * 1000


def _e2b(sdk) -> tuple[float, float]:
    started = time.perf_counter()
    sandbox = sdk.Sandbox.create()
    created = time.perf_counter()
    result = sandbox.commands.run(FIRST_COMMAND)
    done = time.perf_counter()
    assert result.stdout == "ready\n", result
    sandbox.kill()
    return (created - started) * 1000, (done - created) * 1000


def create_to_first_command(controller, sdk, pairs: int) -> dict[str, Any]:
    timings: dict[str, list[tuple[float, float]]] = {"own_api": [], "e2b_api": []}
    runs = {"own_api": lambda: _own(controller), "e2b_api": lambda: _e2b(sdk)}
    for name in runs:  # warm both paths (zygote, SDK transports) outside the timings
        runs[name]()
    for i in range(pairs):
        order = ("own_api", "e2b_api") if i % 2 == 0 else ("e2b_api", "own_api")
        for name in order:
            timings[name].append(runs[name]())
        if (i + 1) % 10 == 0:
            log.info("e2b bench: %d/%d pairs", i + 1, pairs)
    out: dict[str, Any] = {}
    for name, values in timings.items():
        out[name] = {"total": _quantiles([c + f for c, f in values]), "create": _quantiles([c for c, _ in values]),
                     "first_command": _quantiles([f for _, f in values])}
    diffs = [sum(e) - sum(o) for e, o in zip(timings["e2b_api"], timings["own_api"], strict=True)]
    out["e2b_minus_own"] = _quantiles(diffs)
    return out


def concurrent(controller, sdk, count: int) -> dict[str, Any]:
    """`count` sandboxes created at once through the SDK, each running one command; the node
    agents' admission and sharing figures while all of them live."""
    from venusrl.bench.sandbox import _per_sandbox

    def one(_: int):
        started = time.perf_counter()
        sandbox = sdk.Sandbox.create()
        created = time.perf_counter()
        sandbox.commands.run(FIRST_COMMAND)
        return sandbox, (created - started) * 1000, (time.perf_counter() - created) * 1000

    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        made = list(pool.map(one, range(count)))
    wall = time.perf_counter() - started
    sandboxes = [s for s, _, _ in made]
    try:
        nodes = {}
        for node_id, node in controller.nodes.items():
            status = node.call("status")
            nodes[node_id] = {"sandboxes": len(status["sandboxes"]), "m_total_mib": status["m_total"] // MiB,
                              "m_used_mib": round(status["m_used"] / MiB, 1),
                              "threshold_mib": round(status["threshold"] * status["m_total"] / MiB, 1),
                              "g_active_mib": round(status["g_active"] / MiB, 1), "oom_kills": status["oom_kills"],
                              "oom_events": status["oom_events"]}
        sharing = _per_sandbox(controller, [s.sandbox_id for s in sandboxes])
    finally:
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda s: s.kill(), sandboxes))
    return {"sandboxes": count, "wall_s": round(wall, 2), "create": _quantiles([c for _, c, _ in made]),
            "first_command": _quantiles([f for _, _, f in made]), "nodes": nodes,
            "per_sandbox_mib": {**sharing, "shared_rss_minus_uss": round(sharing["rss"] - sharing["uss"], 2)}}


class ServedCluster:
    """A one-node cluster with the E2B service over it and the SDK's environment pointed
    at it, for the bench and the scale test."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        from venusrl.sandbox.e2b.app import E2BServer
        from venusrl.sandbox.e2b.service import E2BService

        self.cluster = LocalCluster(config or SandboxConfig(cold_start_default=32 * MiB), budgets=[NODE_BYTES])
        try:
            key = f"e2b_{secrets.token_hex(16)}"
            self.server = E2BServer(E2BService(self.cluster.controller, key)).start()
        except BaseException:
            self.cluster.close()
            raise
        self._environment = self.server.sdk_environment()
        self._environment.__enter__()

    def close(self) -> None:
        self._environment.__exit__(None, None, None)
        self.server.stop()
        self.cluster.close()


def run_e2b_bench(quick: bool) -> dict[str, Any]:
    sdk = _sdk()
    served = ServedCluster()
    try:
        pairs = 10 if quick else 40
        log.info("e2b bench: create to first command, %d interleaved pairs", pairs)
        latency = create_to_first_command(served.cluster.controller, sdk, pairs)
        log.info("e2b bench: 32 sandboxes at once through the SDK")
        scale = concurrent(served.cluster.controller, sdk, 32)
    finally:
        served.close()
    return {"create_to_first_command": latency, "concurrent_32": scale,
            "config": {"quick": quick, "pairs": pairs, "node_mib": NODE_BYTES // MiB, "template": "base",
                       "first_command": FIRST_COMMAND, "sdk": f"e2b {sdk.__version__ if hasattr(sdk, '__version__') else ''}".strip()}}
