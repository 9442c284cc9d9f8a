python3 setup.py build_ext --inplace > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
export PYTHONPATH=$PWD
for r in 1 2 3 4 5 6; do for v in none feed-on feed-off; do python3 ab_event_feed_child.py $v; done; done > /tmp/ab.jsonl
python3 - <<'PY'
import json, statistics, collections
d = collections.defaultdict(list)
for line in open("/tmp/ab.jsonl"):
    r = json.loads(line); d[r["variant"]].append(r["median"])
for v, xs in d.items(): print(v, "median of medians %.2f us/op" % statistics.median(xs), ["%.1f" % x for x in xs])
on, off = d["feed-on"], d["feed-off"]
print("paired off-on per round:", ["%.2f" % (b - a) for a, b in zip(on, off)], "median %.2f" % statistics.median([b - a for a, b in zip(on, off)]))
PY
