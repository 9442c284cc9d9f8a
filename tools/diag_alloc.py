import os, sys, time, json, subprocess
CODE = r'''
import time, torch, os, sys
mode = sys.argv[1]
if mode != "native":
    import npu_lifetime
    npu_lifetime.install("cuda")
torch.cuda.init()
def loop(n, c):
    t0 = time.perf_counter()
    for _ in range(c):
        t = torch.empty(n, device="cuda"); del t
    return (time.perf_counter() - t0) / c * 1e6
for _ in range(3): loop(1024, 20000)
print(min(loop(1024, 50000) for _ in range(5)))
'''
for mode, env in [("native", {}), ("shim", {}), ("shim", {"NPU_LIFETIME_BRIDGE": "0"}), ("shim", {"NPU_LIFETIME_HOOKS": "none"}), ("shim", {"NPU_LIFETIME_BRIDGE": "0", "NPU_LIFETIME_HOOKS": "none"})]:
    out = subprocess.run([sys.executable, "-c", CODE, mode], capture_output=True, text=True, env=dict(os.environ, **env))
    print(mode, env, out.stdout.strip(), out.stderr[-300:] if out.returncode else "")
