"""Caller trajectories end: released over HTTP, or by the engine's idle TTL when a client
forgets them. Ids are bounded. Afterwards nothing is left pinned: no live trajectory, no KV
in use, no low_ref/high_ref tokens."""

from __future__ import annotations

import asyncio

from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.engine.scheduler_fakes import FakeRunner, make_scheduler, step

from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.config import EngineConfig
from venusrl.engine.engine import Engine
from venusrl.engine.radix_cache import Tier
from venusrl.engine.request import MAX_TRAJECTORY_ID_CHARS
from venusrl.engine.server import create_app
from venusrl.types import Priority, SamplingParams

TTL = 60.0


def pinned(stats: dict) -> dict[str, int]:
    kv = stats["kv_tokens"]
    return {"live": stats["live_trajectories"], "in_use": kv["in_use"], "low_ref": kv["low_ref"],
            "high_ref": kv["high_ref"]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "release", "tick"]), st.integers(0, 7),
                          st.sampled_from(list(Priority))), max_size=60))
def test_release_and_idle_ttl_leave_nothing_pinned(ops):
    """Random turns, releases and clock ticks over 8 trajectory ids: a trajectory is released
    by the TTL only when idle (no request) for TTL, and once every request is done and TTL
    has passed, no trajectory or reference is left."""
    s, runner, now, serial = make_scheduler(kv_capacity_tokens=128), FakeRunner(), 0.0, 0
    sampling = SamplingParams(max_new_tokens=3, stop_token_ids=(-1,))
    for op, index, priority in ops:
        key = f"traj-{index}"
        if op == "add":
            serial += 1
            s.add_request(f"r{serial}", [index + 1] * (4 + index), sampling, priority, key)
        elif op == "step":
            step(s, runner)
        elif op == "release":
            s.release_trajectory(key)
        else:
            now += TTL / 3
            busy = {r.trajectory_key for r in s.requests.values()}
            for released in s.release_idle(now, TTL):
                assert released not in busy
    while s.has_work:
        step(s, runner)
    for _ in range(2):  # the first sweep sees them idle, the next one TTL later releases them
        s.release_idle(now, TTL)
        s.apply_trajectory_changes()
        now += TTL
    s.check_integrity()
    assert not s.cache.trajectories and not s._idle_since
    tiers = s.cache.tier_tokens()
    assert tiers[Tier.LOW_REF] == tiers[Tier.HIGH_REF] == 0


def test_a_busy_trajectory_is_not_expired():
    s, runner = make_scheduler(), FakeRunner()
    s.add_request("r1", [1, 2, 3], SamplingParams(max_new_tokens=50, stop_token_ids=(-1,)), Priority.HIGH, "busy")
    s.start_trajectory("idle", Priority.HIGH)
    step(s, runner)
    assert s.release_idle(0.0, TTL) == []
    assert s.release_idle(TTL, TTL) == ["idle"]
    step(s, runner)
    assert set(s.cache.trajectories) == {"busy"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_thousand_trajectory_ids_over_http_leave_nothing_behind(tiny_model_dir):
    clock = FakeClock()
    config = EngineConfig(kv_capacity_tokens=4096, page_size=4, trajectory_idle_ttl_s=TTL)
    engine = Engine.from_pretrained(tiny_model_dir, config)
    engine.clock = clock
    runner = AsyncEngine(engine)
    ids = [f"trajectory-{i:04d}" for i in range(1000)]
    with TestClient(create_app(runner, engine.tokenizer, "tiny")) as client:
        for i, trajectory_id in enumerate(ids):
            body = {"prompt": [1 + i % 50, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 1, "temperature": 0,
                    "trajectory_id": trajectory_id, "priority": "high" if i % 2 else "low"}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200, response.text
        held = pinned(client.get("/stats").json())
        assert held["live"] == 1000 and held["low_ref"] > 0 and held["high_ref"] > 0
        for trajectory_id in ids[:500]:  # half released by their client
            assert client.post(f"/v1/trajectories/{trajectory_id}/release").status_code == 200
        assert pinned(client.get("/stats").json())["live"] == 500
        again = client.post(f"/v1/trajectories/{ids[0]}/release")
        assert again.status_code == 404 and again.json()["error"]["param"] == "trajectory_id"
        # the other half forgotten: the idle TTL releases them
        for advance in (1.0, TTL):
            clock.now += advance
            asyncio.run(_sweep(runner))
        assert pinned(client.get("/stats").json()) == {"live": 0, "in_use": 0, "low_ref": 0, "high_ref": 0}

        long_id = "x" * (MAX_TRAJECTORY_ID_CHARS + 1)
        response = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1, "trajectory_id": long_id})
        assert response.status_code == 400 and response.json()["error"]["param"] == "trajectory_id"
        response = client.post(f"/v1/trajectories/{long_id}/release")
        assert response.status_code == 400 and "trajectory_id" in response.json()["error"]["message"]
    asyncio.run(runner.shutdown())


async def _sweep(runner: AsyncEngine) -> None:
    await runner.acall(lambda e: e.release_idle_trajectories())
