"""Shared by the sanitizer benchmarks: run one workload under several
variants (none, CSAN, the lifetime sanitizer, the lifetime sanitizer with the
allocator shim), each in a fresh child process, rounds alternating the order,
and print medians and the overhead ratio to CSAN's from the same run."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
VARIANTS_GPU = ("none", "csan", "lifetime", "lifetime+shim")
VARIANTS_SIM = ("none", "lifetime")
FLOOR = "empty-mode"
# the lifetime sanitizer with torch's own trace delivery instead of the GPU
# trace bridge (npu_lifetime/sanitizer/trace_bridge.py): what the bridge saves
TORCH_TRACE = "lifetime-torch-trace"
CHILD_TIMEOUT_S = 300
# NPU_LIFETIME_BENCH_CPUS="2,3": every child runs on those CPUs only, the
# same for every variant (on a shared host, a child's placement moved its
# figures by up to 2x between processes)
CPUS_ENV = "NPU_LIFETIME_BENCH_CPUS"


def pinned_cpus() -> set:
    """The CPUs ``CPUS_ENV`` names (empty: no pinning); a clear error for a bad list."""
    text = os.environ.get(CPUS_ENV, "").strip()
    if not text:
        return set()
    try:
        cpus = {int(part) for part in text.split(",")}
    except ValueError:
        _bad_input(f"{CPUS_ENV}={text!r}: give CPU numbers separated by commas, e.g. 2,3")
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        _bad_input(f"{CPUS_ENV}={text!r}: CPUs {sorted(cpus - allowed)} are not available here "
                   f"(this process may run on {sorted(allowed)})")
    return cpus


def _bad_input(message: str) -> None:
    """Exit 2, as the benchmarks' own argument errors do."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def install_allocator(variant: str) -> None:
    """In a child, before any device work: the variant's allocator (the
    shim for lifetime+shim)."""
    if variant == "lifetime+shim":
        import npu_lifetime

        npu_lifetime.install("cuda")


def setup_variant(variant: str, device: str):
    """In a child, after ``install_allocator``: installs the rest of what the
    variant needs; returns what must be undone at the end: the lifetime
    sanitizer (enabled), the empty mode (entered), or None."""
    if variant == "csan":
        from torch.cuda._sanitizer import enable_cuda_sanitizer

        enable_cuda_sanitizer()
    if variant == FLOOR:
        mode = empty_mode()
        mode.__enter__()
        return mode
    if variant == TORCH_TRACE:
        os.environ["NPU_LIFETIME_TRACE_BRIDGE"] = "0"
    if variant.startswith("lifetime"):
        from npu_lifetime.sanitizer import LifetimeSanitizer

        return LifetimeSanitizer(device, on_race="raise").enable()
    return None


def empty_mode():
    """A TorchDispatchMode that only calls each op (not entered)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class EmptyMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return EmptyMode()


def finish_variant(installed) -> None:
    """Undoes ``setup_variant``; a sanitizer must have found nothing that fails."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if installed is None:
        return
    if isinstance(installed, TorchDispatchMode):  # the empty mode
        installed.__exit__(None, None, None)
        return
    installed.disable()
    findings = installed.failing([f for f in installed.flush() if not getattr(f, "live", False)])
    assert not findings, installed.report(findings)


def run_child(variant: str, device: str, warm_up: Callable, run: Callable, repeats: int) -> None:
    """In a child: warm up and time ``run()`` (which returns its op count)
    ``repeats`` times with only the variant's allocator installed (the
    process's own baseline), then set the variant up, warm up again and time
    it as many times; check the sanitizer found nothing that fails; print
    one JSON line."""
    cpus = pinned_cpus()
    if cpus:
        os.sched_setaffinity(0, cpus)
    install_allocator(variant)
    warm_up()
    baseline, _ = _timed(run, repeats)
    installed = setup_variant(variant, device)
    warm_up()
    sampler = _native_sampler()
    sampler.npl_sampler_start()
    times, ops = _timed(run, repeats)
    sampler.npl_sampler_stop()
    _profile_once(run)
    finish_variant(installed)
    print(json.dumps({"times": times, "baseline": baseline, "ops": ops, "cpus": sorted(os.sched_getaffinity(0)),
                      "trace_bridge": _trace_bridge_installed()}))


def _trace_bridge_installed() -> bool:
    """Whether this child's CUDA trace went through the GPU trace bridge."""
    module = sys.modules.get("npu_lifetime.sanitizer.trace_bridge")
    return module is not None and module.installed()


def _timed(run: Callable, repeats: int) -> tuple:
    """``([seconds per run], ops of the last run)``."""
    times, ops = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops = run()
        times.append(time.perf_counter() - t0)
    return times, ops


def relative_overhead(child: dict) -> float:
    """A child's variant against its own baseline: median time / median
    baseline time - 1.  A host that runs one process uniformly slower than
    another (placement, clocks) scales both, so this cancels it."""
    return statistics.median(child["times"]) / statistics.median(child["baseline"]) - 1


class _NoSampler:
    def npl_sampler_start(self) -> None:
        pass

    npl_sampler_stop = npl_sampler_start


def _native_sampler():
    """benchmarks/profile/sampler.c when it is preloaded with SAMPLER_MANUAL=1
    (it then samples the timed runs only), else a stand-in doing nothing."""
    if os.environ.get("SAMPLER_MANUAL") != "1":
        return _NoSampler()
    import ctypes

    process = ctypes.CDLL(None)
    if not hasattr(process, "npl_sampler_start"):
        raise RuntimeError("SAMPLER_MANUAL=1 but benchmarks/profile/sampler.c is not preloaded (LD_PRELOAD)")
    return process


def _profile_once(run: Callable) -> None:
    """With NPU_LIFETIME_BENCH_PROFILE=PATH: one more ``run()`` under
    cProfile, its top functions by own time written to PATH (where the
    variant's time goes, on the machine that timed it)."""
    path = os.environ.get("NPU_LIFETIME_BENCH_PROFILE")
    if not path:
        return
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    ops = run()
    profile.disable()
    text = io.StringIO()
    print(f"{ops} ops profiled", file=text)
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(40)
    Path(path).write_text(text.getvalue())


def run_rounds(script: str, variants: tuple, rounds: int, child_args: list) -> tuple:
    """In the parent: runs ``script --child VARIANT *child_args`` for every
    variant, ``rounds`` times, each in a fresh process (order reversed every
    other round; ``CHILD_TIMEOUT_S`` each); returns each variant's timing
    samples and its last child's JSON line."""
    samples: dict = {v: [] for v in variants}
    last: dict = {}
    paired: dict = {v: [] for v in variants}  # each child's relative_overhead, in round order
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    cpus = pinned_cpus()  # each child pins itself (run_child) and says where it ran
    if cpus:
        print(f"children pinned to CPUs {sorted(cpus)} ({CPUS_ENV})", file=sys.stderr)
    for r in range(rounds):
        for variant in variants if r % 2 == 0 else reversed(variants):
            try:
                done = subprocess.run([sys.executable, script, "--child", variant, *child_args],
                                      capture_output=True, text=True, env=env, cwd=ROOT, timeout=CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise SystemExit(f"{variant} did not finish in {CHILD_TIMEOUT_S} s (round {r + 1})") from None
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
            last[variant] = json.loads(done.stdout.strip().splitlines()[-1])
            if cpus and set(last[variant].get("cpus", ())) != cpus:
                raise SystemExit(f"{variant} ran on CPUs {last[variant].get('cpus')}, not {sorted(cpus)}")
            samples[variant] += last[variant]["times"]
            if "baseline" in last[variant]:
                paired[variant].append(relative_overhead(last[variant]))
        print(f"round {r + 1}/{rounds} done: {_round_summary(last, variants)}", file=sys.stderr)
    return samples, last, paired


def _round_summary(last: dict, variants: tuple) -> str:
    """This round's medians in us/op (and the overheads / CSAN's), so that a
    run cut short still leaves its finished rounds' figures."""
    per_op = {v: statistics.median(last[v]["times"]) / last[v]["ops"] * 1e6 for v in variants}
    text = ", ".join(f"{v} {per_op[v]:.2f}" for v in variants) + " us/op"
    if "csan" in per_op and per_op["csan"] > per_op["none"]:
        text += "; overhead / CSAN's: " + ", ".join(
            f"{v} {overhead_ratio(per_op, v):.2f}" for v in _sanitizers(per_op))
    return text


def overhead_ratio(medians: dict, variant: str, base: str = "none") -> float:
    """What ``variant`` adds to ``base`` over what CSAN adds to it: the
    benchmarks' figure (any unit, as long as ``medians`` share it)."""
    return (medians[variant] - medians[base]) / (medians["csan"] - medians[base])


def at_least_one(text: str) -> int:
    """An argparse type: a count of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _round_medians(samples: dict, rounds: int) -> list:
    """For each round, each variant's median over that round's runs (one process each)."""
    runs = len(samples["none"]) // rounds
    return [{v: statistics.median(times[r * runs:(r + 1) * runs]) for v, times in samples.items()}
            for r in range(rounds)]


def _ratio_per_round(samples: dict, rounds: int, variant: str) -> list:
    """``variant``'s overhead / CSAN's from each round's samples alone: how
    far the host moved the figure between rounds."""
    return [overhead_ratio(medians, variant) for medians in _round_medians(samples, rounds)]


def fastest_processes(samples: dict, rounds: int) -> dict:
    """Each variant's fastest process (the least of its rounds' medians).  A
    host that runs some processes uniformly slower (the H100 VMs: none alone
    at 15.6-17.0 us/op in 10 of 18 fresh processes and 21.1-29.5 in 8,
    pinned or not; design/notebook/2026-11-27i) moves the medians by
    which processes ran slow; each variant's fastest process is a fast one
    once every variant has drawn one (``near_fastest`` shows whether it
    has).  Taking the least favours the noisier variants a little."""
    return _least(_round_medians(samples, rounds))


def _least(per_round: list) -> dict:
    return {v: min(m[v] for m in per_round) for v in per_round[0]}


def near_fastest(samples: dict, rounds: int, within: float = 0.1) -> dict:
    """How many of each variant's rounds came within ``within`` of its
    fastest: one says its fastest process is a lone draw."""
    per_round = _round_medians(samples, rounds)
    fastest = _least(per_round)
    return {v: sum(m[v] <= fastest[v] * (1 + within) for m in per_round) for v in samples}


def _sanitizers(variants) -> list:
    """The lifetime sanitizer's variants among ``variants``, in order."""
    return [v for v in variants if v.startswith("lifetime")]


def alternate(script: str, device: str, rounds: int, child_args: list, describe: str, floor: bool = False,
              torch_trace: bool = False) -> dict:
    """In the parent: runs every variant ``rounds`` times in fresh processes
    (order reversed every other round); prints the table; returns medians.
    ``floor``: the empty-mode variant too; ``torch_trace``: the lifetime
    sanitizer without the GPU trace bridge too (CUDA only)."""
    variants = (VARIANTS_GPU if device == "cuda" else VARIANTS_SIM) + ((FLOOR,) if floor else ()) \
        + ((TORCH_TRACE,) if torch_trace and device == "cuda" else ())
    samples, last, paired = run_rounds(script, variants, rounds, ["--device", device, *child_args])
    ops = last[variants[0]]["ops"]
    medians = {v: statistics.median(samples[v]) for v in variants}
    base = medians["none"]
    cpus = pinned_cpus()
    print(f"{describe}: {ops} ops per run, device {device}; medians of {rounds} rounds x "
          f"{len(samples['none']) // rounds} runs, variants in alternating fresh processes"
          + (f", pinned to CPUs {sorted(cpus)}" if cpus else ""))
    print("columns: median milliseconds per workload run, microseconds per op, and the ratio to no sanitizer; "
          "'overhead / CSAN overhead' compares what each sanitizer adds to the run")
    print(f"{'variant':<20} {'ms/run':>9} {'us/op':>8} {'x none':>8}")
    for variant in variants:
        m = medians[variant]
        print(f"{variant:<20} {m * 1e3:>9.2f} {m / ops * 1e6:>8.2f} {m / base:>8.2f}")
    if "csan" in medians:
        for variant in _sanitizers(variants):
            spread = ", ".join(f"{r:.2f}" for r in _ratio_per_round(samples, rounds, variant))
            print(f"{variant} overhead / CSAN overhead = {overhead_ratio(medians, variant):.2f} "
                  f"(each round's own medians: {spread})")
        fastest, near = fastest_processes(samples, rounds), near_fastest(samples, rounds)
        print(f"from each variant's fastest process of the {rounds} (none {fastest['none'] / ops * 1e6:.2f}, "
              f"CSAN {fastest['csan'] / ops * 1e6:.2f} us/op): "
              + ", ".join(f"{v} / CSAN = {overhead_ratio(fastest, v):.2f}" for v in _sanitizers(variants))
              + "; rounds within 10% of each variant's fastest: " + ", ".join(f"{v} {near[v]}" for v in variants))
        if FLOOR in medians:
            print(f"above the empty-mode floor ({(medians[FLOOR] - base) / ops * 1e6:.2f} us/op): "
                  + ", ".join(f"{v} / CSAN = {overhead_ratio(medians, v, base=FLOOR):.2f}"
                              for v in _sanitizers(variants)))
    else:
        print(f"lifetime overhead per op: {(medians['lifetime'] - base) / ops * 1e6:.2f} us "
              "(no CSAN on this device: CSAN needs CUDA)")
    if any(paired.values()):
        print(paired_summary(paired))
    if device == "cuda":
        print(_trace_bridge_summary(last, variants))
    return medians


def _trace_bridge_summary(last: dict, variants: tuple) -> str:
    """Which variants' trace went through the GPU trace bridge (each
    lifetime variant's but lifetime-torch-trace's should have)."""
    through = [v for v in variants if last[v].get("trace_bridge")]
    text = "GPU trace bridge installed in: " + (", ".join(through) or "none")
    missing = [v for v in _sanitizers(variants) if v != TORCH_TRACE and v not in through]
    if missing:
        text += (f"\nWARNING: not in {', '.join(missing)}: their figures are torch's own trace delivery "
                 "(npu_lifetime.sanitizer.trace_bridge.failure() in a child says why)")
    return text


def paired_summary(paired: dict) -> str:
    """The comparison within each process: every child timed the workload
    before setting its variant up, so a process the host ran uniformly
    slower moves both.  The variant is always timed second; none's own
    figure (its second block against its first) is that order's drift, and
    each round's figures are corrected by the same round's none:
    (1 + variant) / (1 + none) - 1.  lifetime+shim's baseline has the shim
    installed: its figure is the sanitizer over the shim alone."""
    lines = ["paired within each process (the variant's median run / the same process's median run before it was "
             "set up, - 1; none's is the drift): " + ", ".join(
                 f"{v} {100 * statistics.median(o):+.1f}%" for v, o in paired.items() if o)]
    drift = paired.get("none") or []
    if paired.get("csan") and len(drift) == len(paired["csan"]):
        def corrected(variant: str) -> list:
            return [(1 + o) / (1 + d) - 1 for o, d in zip(paired[variant], drift)]

        csan = corrected("csan")
        for variant in _sanitizers(paired):
            over = " (the sanitizer over the shim alone)" if variant == "lifetime+shim" else ""
            if paired.get(variant) and len(paired[variant]) == len(drift):
                mine = corrected(variant)
                rounds = ", ".join(f"{a / c:.2f}" for a, c in zip(mine, csan))
                lines.append(f"{variant} overhead / CSAN overhead, paired and drift-corrected{over} = "
                             f"{statistics.median(mine) / statistics.median(csan):.2f} (each round: {rounds})")
    return "\n".join(lines)
