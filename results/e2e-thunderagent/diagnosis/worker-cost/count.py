"""Per round: worker CPU, frames sent by op (count, bytes), frames received, per mode (default cell)."""
import collections, json, sys, time
import venusrl.bench.rollout as R
import venusrl.engine.remote.remote as RR
import venusrl.engine.remote.wire as WW
del R.SETUPS["trajectory_level"]; del R.SETUPS["thunderagent"]; del R.SETUPS["venus_no_moves"]
R.MODES = tuple(R.SETUPS); R.BASELINES = ("action_level",); R.VARIANTS = {"venus": ""}
sent = collections.Counter(); sent_bytes = collections.Counter(); recv = collections.Counter()
orig_send = RR._Connection.send
def send(self, header, tensors=None):
    sent[header["op"]] += 1
    sent_bytes[header["op"]] += len(json.dumps(header))
    return orig_send(self, header, tensors)
RR._Connection.send = send
orig_dispatch = RR._Connection._dispatch
def dispatch(self, header, tensors):
    recv[header.get("op")] += 1
    if header.get("op") == "outputs": recv["items"] += len(header["items"])
    return orig_dispatch(self, header, tensors)
RR._Connection._dispatch = dispatch
orig = R._round
async def counted(model_dir, case, mode, *a, **k):
    sent.clear(); sent_bytes.clear(); recv.clear(); c0 = time.process_time()
    r = await orig(model_dir, case, mode, *a, **k)
    print(mode, "cpu", round(time.process_time() - c0, 2), "wall", round(r.figures["time_to_last_step_s"] if hasattr(r, "figures") else 0, 2), flush=True)
    print("  sent", dict(sent)); print("  bytes", dict(sent_bytes)); print("  recv", dict(recv), flush=True)
    return r
R._round = counted
res = R.run_case(False, repeats=int(sys.argv[1]), trainer_factors=(0.5,))
