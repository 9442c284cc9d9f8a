"""``npu-lifetime bench`` on a CPU machine: listing, clear errors, and the
sanitizer benchmark on the simulated device (it crashed with a traceback)."""
import pytest
import torch

from npu_lifetime.cli import main


def _variants():
    """benchmarks/variants.py (the benchmarks' shared module, not a package)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import variants

    return variants


def test_no_name_lists_the_benchmarks_with_what_they_measure(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    assert "sanitizer    Sanitizer overhead on a multi-stream workload" in out
    assert "model        Cost of the lifetime model per event" in out


def test_an_unknown_name_is_an_error_that_lists_the_benchmarks(capsys):
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark 'nope'" in err and "shim_alloc" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_sanitizer_benchmark_runs_on_the_simulated_device_without_cuda(capsys):
    assert main(["bench", "sanitizer", "--rounds", "1", "--steps", "2", "--repeats", "1"]) == 0
    captured = capsys.readouterr()
    assert "no CUDA GPU here: running on the simulated device" in captured.err
    assert "device sim" in captured.out and "columns: median milliseconds per workload run" in captured.out
    assert "lifetime " in captured.out and "csan" not in captured.out
    assert "paired within each process" in captured.out and "lifetime +" in captured.out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_sanitizer_benchmark_asked_for_cuda_without_one_is_a_clear_error(capsys):
    assert main(["bench", "sanitizer", "--device", "cuda"]) == 2
    assert "--device cuda needs a CUDA GPU and this machine has none" in capsys.readouterr().err


def test_the_model_benchmark_explains_its_columns(capsys):
    assert main(["bench", "model", "--rounds", "200", "--repeats", "1"]) == 0
    assert "columns: microseconds spent in the model per event" in capsys.readouterr().out


def test_each_round_reports_its_own_figures_so_a_cut_run_leaves_them():
    """A benchmark cut by its time limit on the GPU host left only 'round 1/2
    done'; each round now prints its medians and overheads / CSAN's."""
    _round_summary = _variants()._round_summary

    last = {"none": {"times": [0.010, 0.012, 0.011], "ops": 1000},
            "csan": {"times": [0.110], "ops": 1000},
            "lifetime": {"times": [0.030, 0.031], "ops": 1000},
            "lifetime+shim": {"times": [0.021], "ops": 1000}}
    text = _round_summary(last, ("none", "csan", "lifetime", "lifetime+shim"))
    assert "none 11.00" in text and "csan 110.00" in text
    assert "lifetime 0.20" in text and "lifetime+shim 0.10" in text  # (30.5-11)/99 rounds to 0.20; (21-11)/99 to 0.10


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_children_pinned_to_the_cpus_asked_for_and_a_bad_list_is_a_clear_error(monkeypatch, capsys):
    import os

    cpu = min(os.sched_getaffinity(0))
    monkeypatch.setenv("NPU_LIFETIME_BENCH_CPUS", str(cpu))
    assert main(["bench", "sanitizer", "--rounds", "1", "--steps", "2", "--repeats", "1"]) == 0
    captured = capsys.readouterr()
    assert f"children pinned to CPUs [{cpu}]" in captured.err and f"pinned to CPUs [{cpu}]" in captured.out
    # each child checked where it ran (run_rounds stops on a child that ran elsewhere)
    for bad, message in (("two", "give CPU numbers separated by commas"),
                         ("100000", "CPUs [100000] are not available here")):
        monkeypatch.setenv("NPU_LIFETIME_BENCH_CPUS", bad)
        assert main(["bench", "sanitizer", "--rounds", "1", "--steps", "2", "--repeats", "1"]) == 2
        assert message in capsys.readouterr().err


def test_the_paired_figure_compares_each_process_with_its_own_baseline():
    """Between fresh processes the H100 host moved every variant by up to 2x
    (none 17-34 us/op in one run); each child now also times the workload
    before setting its variant up, and the paired figure divides by that."""
    paired_summary, relative_overhead = _variants().paired_summary, _variants().relative_overhead

    # a process running 2x slower throughout has the same relative overhead
    assert relative_overhead({"times": [0.030, 0.031, 0.029], "baseline": [0.010]}) == pytest.approx(2.0)
    assert relative_overhead({"times": [0.060], "baseline": [0.020, 0.021, 0.019]}) == pytest.approx(2.0)
    # no drift: the ratios of the relative overheads
    text = paired_summary({"none": [0.0, 0.0], "csan": [9.0, 7.0], "lifetime": [1.8, 2.1],
                           "lifetime+shim": [0.9, 1.4]})
    assert "none +0.0%, csan +800.0%, lifetime +195.0%, lifetime+shim +115.0%" in text, text
    assert "lifetime overhead / CSAN overhead, paired and drift-corrected = 0.24 (each round: 0.20, 0.30)" in text
    assert ("lifetime+shim overhead / CSAN overhead, paired and drift-corrected (the sanitizer over the shim "
            "alone) = 0.14 (each round: 0.10, 0.20)") in text, text
    # a second block 10% slower in every process: corrected by none's same-round figure
    text = paired_summary({"none": [0.1], "csan": [8.9], "lifetime": [1.2], "lifetime+shim": [0.65]})
    # (2.2 / 1.1 - 1) / (9.9 / 1.1 - 1) = 1 / 8 = 0.125 (uncorrected: 1.2 / 8.9 = 0.135)
    assert "lifetime overhead / CSAN overhead, paired and drift-corrected = 0.12 (each round: 0.12)" in text, text


def test_the_fastest_process_figure_takes_each_variants_fastest_round():
    """On the H100 VMs a whole process ran at one of two speeds about 1.6x
    apart (none 15.6-29.5 us/op between fresh processes, pinned or not):
    each variant's fastest round is compared, so a variant whose processes
    happened to draw the slow speed more often is not charged for it."""
    fastest, overhead_ratio = _variants().fastest_processes, _variants().overhead_ratio
    # two rounds of two runs: round 1 fast for none and lifetime, round 2 fast for csan
    samples = {"none": [1.0, 1.2, 1.6, 1.7], "csan": [16.0, 16.4, 9.0, 9.2], "lifetime": [3.0, 3.0, 4.8, 5.0]}
    best = fastest(samples, rounds=2)
    assert best == {"none": pytest.approx(1.1), "csan": pytest.approx(9.1), "lifetime": pytest.approx(3.0)}
    assert overhead_ratio(best, "lifetime") == pytest.approx((3.0 - 1.1) / (9.1 - 1.1))
    assert _variants().near_fastest(samples, rounds=2) == {"none": 1, "csan": 1, "lifetime": 1}
