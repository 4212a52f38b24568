"""Run in the head node's namespace of a `NamespacedCluster`: two engine actors, each on an
engine node, answer a prompt, and the first sends the prompt's prefix KV to the second. Prints
one JSON line: the engines' handshakes, the tokens moved, the KV bytes they hold."""

import asyncio
import json
import sys

import ray

from venusrl.engine.config import EngineConfig
from venusrl.engine.remote.process import EngineSpec
from venusrl.engine.remote.remote import RemoteEngine
from venusrl.runtime.ray_runtime import open_engine_actors, start_engine_actors
from venusrl.types import Priority, SamplingParams

PROMPT = list(range(1, 41))
GREEDY = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(-1,))


async def probe(model_dir: str) -> dict:
    actors = start_engine_actors(2, gpus=0)
    handshakes = await open_engine_actors(actors, EngineSpec(model_dir=model_dir,
                                                             engine=EngineConfig(kv_capacity_tokens=512, page_size=4)))
    source, target = (RemoteEngine.from_handshake(h) for h in handshakes)
    async for _ in source.generate(PROMPT, GREEDY, Priority.HIGH, "moved"):
        pass
    kv_bytes = (await source.export_prefix(PROMPT)).kv.k.nbytes * 2
    await target.start_trajectory("moved", Priority.HIGH)
    moved = await source.send_prefix(PROMPT, target, "moved")
    for client in (source, target):
        await client.shutdown()
    return {"driver": ray.util.get_node_ip_address(), "engines": handshakes, "moved_tokens": moved,
            "kv_bytes": kv_bytes}


if __name__ == "__main__":
    ray.init(log_to_driver=False)
    print(json.dumps(asyncio.run(probe(sys.argv[1])), default=str))
