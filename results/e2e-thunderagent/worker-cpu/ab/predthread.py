import sys, time, collections, runpy
from pathlib import Path
import venusrl.coordinator.predictors.background as B
acc = collections.Counter(); n = collections.Counter()
orig = B.BackgroundPredictor._run
def run(self, call, what):
    a = time.thread_time(); r = orig(self, call, what); acc[what] += time.thread_time() - a; n[what] += 1; return r
B.BackgroundPredictor._run = run
orig_serve = B.BackgroundPredictor._serve
def serve(self):
    a = time.thread_time()
    try: orig_serve(self)
    finally: print("   predictor thread total", round(time.thread_time() - a, 3), {k: (n[k], round(v, 3)) for k, v in acc.items()}, flush=True); acc.clear(); n.clear()
B.BackgroundPredictor._serve = serve
sys.argv = ["ab.py", *sys.argv[1:]]
runpy.run_path(str(Path(__file__).with_name("ab.py")), run_name="__main__")
