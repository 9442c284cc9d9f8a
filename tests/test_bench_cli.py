"""``npu-lifetime bench`` on a CPU machine: listing, clear errors, and the
sanitizer benchmark on the simulated device (it crashed with a traceback)."""
import pytest
import torch

from npu_lifetime.cli import main


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_sanitizer_benchmark_asked_for_cuda_without_one_is_a_clear_error(capsys):
    assert main(["bench", "sanitizer", "--device", "cuda"]) == 2
    assert "--device cuda needs a CUDA GPU and this machine has none" in capsys.readouterr().err


def test_the_model_benchmark_explains_its_columns(capsys):
    assert main(["bench", "model", "--rounds", "200", "--repeats", "1"]) == 0
    assert "columns: microseconds spent in the model per event" in capsys.readouterr().out
