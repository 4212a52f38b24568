"""What an idle vLLM CPU engine with NixlConnector burns, and how fast it then decodes: one engine
(its worker bound to core 0), 200 greedy tokens to warm up, 10 s idle with the CPU time of every
thread of this process tree read from /proc before and after (threads over 5 ticks listed, with
their allowed cores), then 200 greedy tokens timed. Usage: idle_thread.py nixl|none"""
import asyncio, os, sys, glob, time
from venusrl.engine.config import EngineConfig
from venusrl.engine.vllm.backend import VLLMEngine
from venusrl.model.tiny import make_tiny_model
from venusrl.types import Priority, SamplingParams

def threads():
    me = os.getpid(); out = {}
    kids = {me}
    for _ in range(3):
        for pid in os.listdir("/proc"):
            if not pid.isdigit(): continue
            try: st = open(f"/proc/{pid}/stat").read()
            except OSError: continue
            if int(st.rsplit(")",1)[1].split()[1]) in kids: kids.add(int(pid))
    for pid in kids:
        for t in glob.glob(f"/proc/{pid}/task/*"):
            try:
                f = open(t + "/stat").read().rsplit(")",1)[1].split(); name = open(t+"/comm").read().strip()
            except OSError: continue
            out[(pid, t.rsplit("/",1)[1], name)] = (int(f[11]) + int(f[12]))
    return out

async def main():
    m = make_tiny_model("/tmp/nixl-migration/model", layers=2, hidden=128, heads=2, kv_heads=1, head_dim=64, seed=3)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    e = VLLMEngine.start(m, EngineConfig(kv_capacity_tokens=4096, page_size=32, max_running_requests=4, vllm_kv_connector=sys.argv[1]))
    p = SamplingParams(max_new_tokens=200, temperature=0, stop_token_ids=(-1,))
    async for _ in e.generate(list(range(50)), p, Priority.HIGH): pass
    a = threads(); t = time.time(); await asyncio.sleep(10); b = threads()
    busy = sorted(((b[k]-a.get(k,0)), k) for k in b if b[k]-a.get(k,0) > 5)
    print("IDLE", sys.argv[1], [(v, k, [l for l in open(f"/proc/{k[0]}/task/{k[1]}/status").read().splitlines() if l.startswith("Cpus_allowed_list")]) for v, k in busy[::-1][:6]], flush=True)
    t0 = time.perf_counter()
    async for _ in e.generate(list(range(50)), p, Priority.HIGH): pass
    print("DECODE200", sys.argv[1], round(time.perf_counter() - t0, 3), flush=True)
    await e.shutdown()
if __name__ == "__main__":
    asyncio.run(main())
