"""Diagnostics for the cost of torch.empty + del under the shim: the same
loop in fresh processes with torch's native allocator, the shim, and the
shim without its torch bridge (NPU_LIFETIME_BRIDGE=0) and/or without its
allocator-object hooks (NPU_LIFETIME_HOOKS=none), each the best of 5 x 50k
ops of 4 KiB.  Needs a CUDA GPU.

    python tools/diag_alloc.py
"""
import os
import subprocess
import sys

CHILD = r'''
import sys, time, torch
if sys.argv[1] != "native":
    import npu_lifetime
    npu_lifetime.install("cuda")
torch.cuda.init()

def loop(n, count):
    t0 = time.perf_counter()
    for _ in range(count):
        t = torch.empty(n, device="cuda")
        del t
    return (time.perf_counter() - t0) / count * 1e6

for _ in range(3):
    loop(1024, 20000)
print(min(loop(1024, 50000) for _ in range(5)))
'''

VARIANTS = [
    ("native", {}),
    ("shim", {}),
    ("shim", {"NPU_LIFETIME_BRIDGE": "0"}),
    ("shim", {"NPU_LIFETIME_HOOKS": "none"}),
    ("shim", {"NPU_LIFETIME_BRIDGE": "0", "NPU_LIFETIME_HOOKS": "none"}),
]

if __name__ == "__main__":
    for mode, env in VARIANTS:
        done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                              env=dict(os.environ, **env))
        print(mode, env, done.stdout.strip(), done.stderr[-300:] if done.returncode else "")
