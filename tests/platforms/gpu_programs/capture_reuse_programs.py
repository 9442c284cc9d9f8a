"""torch's test_graph_capture_reclaim_2_streams / _4_streams scenarios
(graph_capture_record_stream_reuse), run under the shim ("shim") or under
torch's own allocator ("native", the control), and a replay that checks the
reuse is ordered after the other streams' reads.  Each prints one JSON line.

    python tests/platforms/gpu_programs/capture_reuse_programs.py PROGRAM ALLOCATOR [on|off]
"""
import json
import sys

import torch

import npu_lifetime
from npu_lifetime import shim


def setup(allocator: str, setting: str) -> dict:
    if allocator == "shim":
        npu_lifetime.install("cuda")
    torch.cuda.memory._set_allocator_settings(f"graph_capture_record_stream_reuse:{setting == 'on'}")
    torch.cuda.empty_cache()
    return {"backend": torch.cuda.get_allocator_backend()}


def result(allocator: str, info: dict, **values) -> dict:
    torch.cuda.memory._set_allocator_settings("graph_capture_record_stream_reuse:False")
    found = shim.findings() if allocator == "shim" else []
    return {**info, **values, "findings": found}


def two_streams(allocator, setting="on"):
    """The upstream 2-stream test, with values: data1 = 1, s2 reads it into
    buf2 = data1 + 2, then data3 (after the join) is filled with 7; every
    replay must leave buf2 == 3."""
    info = setup(allocator, setting)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        g.capture_begin()
        sink1 = torch.empty(8, device="cuda")
        data1 = torch.ones(8, device="cuda")
        data1_ptr = data1.data_ptr()
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            buf2 = torch.empty_like(data1)
            torch.add(data1, 2.0, out=buf2)
            data1.record_stream(s2)
        del data1
        data2 = torch.empty(8, device="cuda")
        data2_ptr = data2.data_ptr()
        s1.wait_stream(s2)
        sink1.fill_(1.0)
        data3 = torch.empty(8, device="cuda")
        data3_ptr = data3.data_ptr()
        data3.fill_(7.0)
        g.capture_end()
    torch.cuda.synchronize()
    bridged = shim.graph_capture_record_stream_reuse() if allocator == "shim" else None
    replays_ok = []
    for _ in range(10):
        g.replay()
        torch.cuda.synchronize()
        replays_ok.append(bool((buf2 == 3).all()) and bool((data3 == 7).all()))
    return result(allocator, info, before_join_reused=data2_ptr == data1_ptr, after_join_reused=data3_ptr == data1_ptr,
                  replays_ok=replays_ok, setting_seen_by_shim=bridged)


def four_streams(allocator, setting="on"):
    """The upstream 4-stream test: partial joins (s2 -> s1, s4 -> s3) do not
    allow the reuse, the final join (s3 -> s1) does."""
    info = setup(allocator, setting)
    s1, s2, s3, s4 = (torch.cuda.Stream() for _ in range(4))
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        g.capture_begin()
        data1 = torch.ones(8, device="cuda")
        data1_ptr = data1.data_ptr()
        sink1 = torch.empty_like(data1)
        sink3 = torch.empty_like(data1)
        bufs = []
        for stream, value in ((s2, 2.0), (s3, 3.0), (s4, 4.0)):
            stream.wait_stream(s1)
            with torch.cuda.stream(stream):
                buf = torch.empty_like(data1)
                torch.add(data1, value, out=buf)
                data1.record_stream(stream)
                bufs.append(buf)
        del data1
        s1.wait_stream(s2)
        sink1.fill_(1.0)
        s3.wait_stream(s4)
        with torch.cuda.stream(s3):
            sink3.fill_(3.0)
            sink3.record_stream(s3)
        data2 = torch.empty(8, device="cuda")
        data2_ptr = data2.data_ptr()
        s1.wait_stream(s3)
        sink1.add_(sink3)
        data3 = torch.empty(8, device="cuda")
        data3_ptr = data3.data_ptr()
        data3.fill_(9.0)
        g.capture_end()
    torch.cuda.synchronize()
    replays_ok = []
    for _ in range(10):
        g.replay()
        torch.cuda.synchronize()
        replays_ok.append(all(bool((b == 1 + v).all()) for b, v in zip(bufs, (2, 3, 4))))
    return result(allocator, info, before_join_reused=data2_ptr == data1_ptr, after_join_reused=data3_ptr == data1_ptr,
                  replays_ok=replays_ok)


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])))
