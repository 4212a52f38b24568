"""Probe: does vLLM 0.32 CPU's ExampleConnector move a prefix's KV from one engine to another?"""
import asyncio, os, sys, time
from pathlib import Path
from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.inputs import TokensPrompt
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from venusrl.engine.config import EngineConfig
from venusrl.engine.vllm.args import engine_args
from venusrl.model.tiny import make_tiny_model

STORE = "/tmp/i20/conn/store"

def start(model_dir):
    args = engine_args(model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=32, max_running_requests=4))
    args.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                                               kv_connector_extra_config={"shared_storage_path": STORE})
    args.scheduler_cls = None  # vLLM's own scheduler for the probe
    return AsyncLLM.from_vllm_config(args.create_engine_config(UsageContext.ENGINE_CONTEXT))

async def gen(llm, prompt, rid):
    last = None
    async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), rid):
        last = out
    return last

async def main():
    model_dir = make_tiny_model("/tmp/i20/conn/model", layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, seed=3)
    prompt = [(i * 7) % 250 for i in range(96)]
    a = start(model_dir)
    out_a = await gen(a, prompt, "a")
    a.shutdown()
    files = sum(len(f) for _, _, f in os.walk(STORE))
    print("PROBE stored files:", files, "output", list(out_a.outputs[0].token_ids), "cached", out_a.num_cached_tokens, flush=True)
    b = start(model_dir)
    out_b = await gen(b, prompt, "b")
    print("PROBE engine b output", list(out_b.outputs[0].token_ids), "num_cached_tokens", out_b.num_cached_tokens,
          "kv_transfer_params", out_b.kv_transfer_params, flush=True)
    b.shutdown()

if __name__ == "__main__":
    asyncio.run(main())
