"""The corpus of publicly reported bugs on npu: the real torch_npu over the
stand-in CANN runtime (not NPU hardware).  Every case whose kernels the
stand-in has runs there, the vllm-ascend case among them: buggy forms fail
the check, fixed forms pass, and under the shim's debug mode with a slow
kernel the buggy form's data is corrupted and the fixed forms' intact."""
import subprocess

from helpers.npu_helpers import npu_environment, require_npu_python

from npu_lifetime.corpus import case_modules


def test_corpus_on_npu_with_the_debug_shim():
    python = require_npu_python()
    done = subprocess.run([python, "-m", "npu_lifetime.cli", "corpus", "--device", "npu", "--corruption"],
                          capture_output=True, text=True, timeout=900, env=npu_environment())
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    on_npu = [name for name, m in case_modules().items() if "npu" in m.CASE.devices]
    assert len(on_npu) >= 8
    for name in on_npu:
        assert f"{name}  [caught]" in done.stdout or f"{name}  [known gap]" in done.stdout, name
    assert "vllm_ascend_sampler_q  [caught]" in done.stdout
    vllm = done.stdout.split("vllm_ascend_sampler_q  [caught]")[1]
    assert "buggy CORRUPTED, upstream intact, record_use intact -> as expected: yes" in vllm
    assert f"{len(on_npu)} cases: " in done.stdout and " 0 wrong" in done.stdout
