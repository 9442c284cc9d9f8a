"""A hand-written allocator trace and the final shim snapshot it leads to,
in the schema of ``shim.api.trace()`` / ``shim.api.snapshot()``.

One 2 MiB segment on the compute stream C; the comm stream M and a side
stream S use blocks:
  A  record_use on M, freed, pending until M's event fired, reusable
  B  record_stream on M (and later S), still live at the end
  D  a use on M nothing recorded (note_use), freed: a finding, still pending
  E  A's address again, record_use on S, freed into the cache (stream-wait)
  F  E's address again, handed out behind a GPU-side wait, freed, freed again
and a free of an address the shim never handed out.  As the shim traces
them: a free straight into the cache is followed by ``reusable``; findings
carry no device (-1) and no generation; reuse_wait precedes the new owner's
alloc with the old owner's generation.
"""
C, M, S = 0x10, 0x20, 0x30
SEG = 0x10000000
K = 256 * 1024
MIB2 = 2 * 1024 * 1024
A = E = F = SEG
B, D = SEG + K, SEG + 2 * K
UNKNOWN = 0xDEAD0000

_STEPS = [
    # kind, ptr, size, stream, generation
    ("segment_alloc", SEG, MIB2, C, 0),
    ("alloc", A, K, C, 1),
    ("record_use", A, K, M, 1),
    ("alloc", B, K, C, 1),
    ("record_stream", B, K, M, 1),
    ("free", A, K, C, 1),
    ("pending", A, K, C, 1),
    ("alloc", D, K, C, 1),
    ("note_use", D, K, M, 1),
    ("reusable", A, K, C, 1),
    ("free", D, K, C, 1),
    ("finding", D, 0, M, 0),
    ("pending", D, K, C, 1),
    ("alloc", E, K, C, 2),
    ("record_use", E, K, S, 2),
    ("free", E, K, C, 2),
    ("reusable", E, K, C, 2),
    ("reuse_wait", E, K, C, 2),
    ("alloc", F, K, C, 3),
    ("free", F, K, C, 3),
    ("reusable", F, K, C, 3),
    ("finding", F, 0, C, 0),
    ("finding", UNKNOWN, 0, C, 0),
    ("record_stream", B, K, S, 1),
]


def trace() -> list:
    return [
        {"t_ns": 1_000_000 + 1000 * i, "kind": kind, "ptr": ptr, "size": size, "device": -1 if kind == "finding" else 0,
         "stream": stream, "alloc_stream": 0 if kind == "finding" else C, "generation": gen}
        for i, (kind, ptr, size, stream, gen) in enumerate(_STEPS)
    ]


def _block(address, size, state, generation, recorded=(), use_events=(), held=(), requested=None):
    b = {"address": address, "size": size, "state": state, "alloc_stream": C, "generation": generation,
         "recorded_streams": list(recorded), "use_events": list(use_events), "held_events": list(held)}
    if requested is not None:
        b["requested"] = requested
    return b


def snapshot() -> dict:
    return {
        "runtime": "sim",
        "policy": "stream_wait",
        "segments": [{
            "address": SEG, "size": MIB2, "device": 0, "stream": C, "pool": "small",
            "blocks": [
                _block(F, K, "cached", 3),
                _block(B, K, "live", 1, recorded=(M, S), requested=K - 100),
                _block(D, K, "pending", 1, held=[{"stream": M, "must_fire": True}]),
                _block(SEG + 3 * K, MIB2 - 3 * K, "cached", 0),
            ],
        }],
    }


def findings() -> list:
    return [
        {"kind": "unrecorded_use", "op": "free", "address": D, "size": K, "device": 0, "alloc_stream": C,
         "stream": M, "detail": "freed while a use on another stream, neither recorded nor finished, was queued"},
        {"kind": "double_free", "op": "free", "address": F, "size": K, "device": 0, "alloc_stream": C,
         "stream": C, "detail": "the block was already freed"},
        {"kind": "unknown_pointer", "op": "free", "address": UNKNOWN, "size": 0, "device": 0, "alloc_stream": C,
         "stream": C, "detail": "not a block of this shim"},
    ]


FRAMES = {1: [{"filename": "/home/user/train.py", "line": 42, "name": "forward"}]}
