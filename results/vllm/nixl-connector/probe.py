"""Probe: does vLLM 0.32 CPU's NixlConnector move a prompt's KV from one live engine to another,
when the target's prompt is that prompt plus a few tokens (a moved agent turn)?

Two vLLM CPU engines live at once, each on its own core, each with NixlConnector (pull mode,
kv_role kv_both, kv_buffer_device cpu, UCX over loopback only). Engine A prefills PREFIX with
do_remote_decode; engine B serves a longer prompt with the kv_transfer_params A returned.

  mode direct:   B gets PREFIX + EXTRA with A's params (what venus's move would send).
  mode two_step: B gets PREFIX with A's params (max_tokens 1: pull only), then PREFIX + EXTRA
                 as a plain request that should hit B's prefix cache (the pulled blocks).
  mode two_step_warm: two_step, with PREFIX already in A's prefix cache (an earlier turn).

Usage: probe.py MODE [PREFIX_LEN [EXTRA_LEN]] (defaults 96 and 8; the KV block is 32 tokens).
The reference is PREFIX + EXTRA served greedily on A after the transfer with a cache salt, so
with no prefix-cache hit and no transfer: a from-scratch prefill."""
import asyncio, contextlib, os, sys, time

# loopback only: the NIXL side channel (ZMQ) and UCX's TCP transport stay on 127.0.0.1 / lo
os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_TLS", "self,sm,tcp")

from vllm import SamplingParams
from vllm.config import KVTransferConfig
from vllm.inputs import TokensPrompt
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from venusrl.engine.config import EngineConfig
from venusrl.engine.vllm.args import engine_args
from venusrl.model.tiny import make_tiny_model

PREFIX_LEN = int(sys.argv[2]) if len(sys.argv) > 2 else 96  # 96: 3 blocks of 32
EXTRA_LEN = int(sys.argv[3]) if len(sys.argv) > 3 else 8
PREFIX = [(i * 7) % 250 for i in range(PREFIX_LEN)]
EXTRA = [(11 * (i + 1)) % 250 for i in range(EXTRA_LEN)]  # the moved turn's new tokens (tool answer etc.)
NEW = 8


@contextlib.contextmanager
def env(**kv):
    before = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: str(v) for k, v in kv.items()})
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def start(model_dir, engine_id, core, port):
    args = engine_args(model_dir, EngineConfig(kv_capacity_tokens=4096, page_size=32, max_running_requests=4))
    args.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                                               kv_buffer_device="cpu", engine_id=engine_id,
                                               kv_connector_extra_config={"backends": ["UCX"]})
    args.scheduler_cls = None  # vLLM's own scheduler for the probe
    # the engine core and worker processes read these when spawned
    with env(VLLM_CPU_OMP_THREADS_BIND=core, VLLM_NIXL_SIDE_CHANNEL_PORT=port):
        return AsyncLLM.from_vllm_config(args.create_engine_config(UsageContext.ENGINE_CONTEXT))


async def gen(llm, prompt, rid, max_tokens=NEW, params=None, salt=None):
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                        extra_args={"kv_transfer_params": params} if params is not None else None)
    tp = TokensPrompt(prompt_token_ids=prompt) if salt is None else TokensPrompt(prompt_token_ids=prompt, cache_salt=salt)
    last = None
    async for out in llm.generate(tp, sp, rid):
        last = out
    return last


def show(tag, out):
    print(f"PROBE {tag}: output {list(out.outputs[0].token_ids)} num_cached_tokens {out.num_cached_tokens} "
          f"kv_transfer_params {out.kv_transfer_params}", flush=True)


async def main(mode):
    model_dir = make_tiny_model("/tmp/i20/nixl/model", layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, seed=3)
    a = start(model_dir, "engine-A", 0, 5600)
    b = start(model_dir, "engine-B", 1, 5610)
    try:
        if mode == "two_step_warm":  # the source already holds the prefix (an earlier turn), as in a move
            show("A earlier turn (plain)", await gen(a, PREFIX, "a-earlier", max_tokens=1))
        t = time.perf_counter()
        out_a = await gen(a, PREFIX, "a-prefill", max_tokens=1, params={"do_remote_decode": True})
        show("A prefill (do_remote_decode)", out_a)
        params = out_a.kv_transfer_params
        long_prompt = PREFIX + EXTRA
        if mode == "direct":
            out_b = await asyncio.wait_for(gen(b, long_prompt, "b-long", params=dict(params)), 120)
            show("B long prompt with A's params", out_b)
        else:
            pulled = await asyncio.wait_for(gen(b, PREFIX, "b-pull", max_tokens=1, params=dict(params)), 120)
            show("B pull (prefix, max_tokens 1)", pulled)
            out_b = await asyncio.wait_for(gen(b, long_prompt, "b-long"), 120)
            show("B long prompt, plain", out_b)
        print(f"PROBE transfer phase {time.perf_counter() - t:.2f}s", flush=True)
        ref = await gen(a, long_prompt, "a-ref", salt="reference")
        show("A reference (long prompt, cache salt: no cache hit, no transfer)", ref)
        same = list(ref.outputs[0].token_ids) == list(out_b.outputs[0].token_ids)
        print(f"PROBE RESULT mode={mode} prefix={PREFIX_LEN} extra={EXTRA_LEN} moved_tokens={out_b.num_cached_tokens} greedy_equal={same}", flush=True)
    finally:
        a.shutdown()
        b.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "direct"))
