"""Per rank and mode, the FSDP2 reports a `pytest -s tests/recording/test_gpu_fsdp2.py`
log printed: losses against the recipe's, peak active/reserved memory, step
time, the sanitizer's unexpected findings and the pressure phase.

    python3 tools/fsdp2_log_summary.py LOG
"""
import json, sys
text = open(sys.argv[1]).read()
dec = json.JSONDecoder()
i = 0
while True:
    j = text.find("[\n {", i)
    if j < 0: break
    try:
        obj, end = dec.raw_decode(text, j)
    except ValueError:
        i = j + 1; continue
    i = end
    for r in obj:
        if "timing" not in r: continue
        t = r["timing"]
        base = t.get("recipe", {}).get("losses")
        for mode, m in t.items():
            same = "same" if m.get("losses") == base else "DIFFER"
            print(f"{r['allocator']:<6} rank {r['rank']} {mode:<12} losses {same} (last {m['losses'][-1]:.6f}) "
                  f"peak active {m['peak_active_bytes']/2**20:.1f} MiB reserved {m['peak_reserved_bytes']/2**20:.1f} MiB "
                  f"step {m['step_ms_median']:.2f} ms")
        san = r.get("sanitizer", {})
        for mode, s in san.items():
            print(f"{r['allocator']:<6} rank {r['rank']} sanitizer {mode}: unexpected {s.get('findings',{}).get('unexpected')} ")
        for mode, p in r.get("pressure", {}).items():
            print(f"{r['allocator']:<6} rank {r['rank']} pressure {mode}: corrupted={p.get('corrupted')}")
