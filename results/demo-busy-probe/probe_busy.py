"""What an SFT model does after the busy error: sampled rollouts on busy rows, counted."""
import asyncio, json, sys, collections
from pathlib import Path
from venusrl.config import load_config
from venusrl.engine.async_engine import AsyncEngine
from venusrl.engine.engine import Engine
from venusrl.env.calculator import CalculatorEnv, generate_dataset
from venusrl.model.chat import load_tokenizer
from venusrl.model.checkpoint import load_model
from venusrl.rollout.agent_loop import run_agent_loop
from venusrl.rollout.generate import engine_generate
d = Path(sys.argv[1]); n = int(sys.argv[2]); temp = float(sys.argv[3]); steps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
config = load_config("examples/demo.yaml", [f"rollout.temperature={temp}"])
rows = [dict(r, busy_calls=b) for r in generate_dataset(n, seed=77, min_steps=steps, max_steps=steps) for b in (0, 1)]
async def main():
    tok = load_tokenizer(d); eng = AsyncEngine(Engine(load_model(d), config.engine, tok))
    gen = engine_generate(eng)
    async def one(i, r):
        env = CalculatorEnv()
        ro = await run_agent_loop(env, r, gen, tok, config.rollout, f"{r['id']}-{r['busy_calls']}-{i}")
        return r, ro, env
    res = await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    stats = collections.Counter()
    for r, ro, env in res:
        b = r["busy_calls"]; stats[(b, "n")] += 1; stats[(b, "reward")] += ro.reward
        stats[(b, f"calls={env.tool_calls}")] += 1
    for k in sorted(stats, key=str): print(k, stats[k])
    for r, ro, env in res[:12]:
        print(r["question"], r["answer"], r["busy_calls"], [(m.get("content"), m.get("tool_calls") and m["tool_calls"][0]["function"]["arguments"]) for m in ro.messages[2:]])
    await eng.shutdown()
asyncio.run(main())
