# before: `git archive 451767a src | tar -x -C /tmp/before`; after: this branch. Run from anywhere.
cd "$(dirname "$0")/../../.."
for i in 1 2 3 4 5 6; do
  for side in before after; do
    if [ $side = before ]; then src=/tmp/before/src; else src=$PWD/src; fi
    echo "$side $i $(PYTHONPATH=$src .venv/bin/python results/engine-gpu/cpu-quick-paired/tp_one.py 2>/dev/null)"
  done
done
