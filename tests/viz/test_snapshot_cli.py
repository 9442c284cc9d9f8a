"""``npu-lifetime snapshot`` on the simulated runtime: the demo, scripts,
bad input, and (where the shim has its allocator trace) the recorded trace."""
import json
import pickle

import pytest
import torch
import torch.cuda._memory_viz as torch_viz

from npu_lifetime.cli import main
from npu_lifetime.viz import demo, lives, memory_viz
from npu_lifetime.viz.snapshot import run_demo
from npu_lifetime.viz.trace import shim_has_trace
from helpers.scripts import forgotten_handoff, write_script

needs_trace = pytest.mark.skipif(not shim_has_trace(), reason="this shim build has no allocator trace yet")




def test_demo_writes_a_pickle_torch_reads_and_a_timeline(tmp_path, capsys, sim_shim):
    prefix = tmp_path / "demo"
    assert main(["snapshot", "--demo", "--out", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "state: live = held by a tensor; pending = freed" in out  # the legend line
    assert f"wrote {prefix}.pickle" in out and f"wrote {prefix}.html" in out
    with open(f"{prefix}.pickle", "rb") as f:
        data = pickle.load(f)
    assert "total_allocated: 3.0MiB" in torch_viz.segsum(data)
    states = sorted(b["state"] for s in data["segments"] for b in s["blocks"] if b["state"] != "inactive")
    assert states == ["active_allocated", "active_allocated", "active_pending_free"]
    assert "<svg" in (tmp_path / "demo.html").read_text()


def test_demo_ends_with_its_findings_and_a_block_still_waiting(sim_shim):
    rec = run_demo(capacity=1 << 16).recording
    assert [f["kind"] for f in rec.shim_findings] == ["double_free", "unrecorded_use"]
    blocks = [b for s in rec.snapshot["segments"] for b in s["blocks"]]
    (pending,) = [b for b in blocks if b["state"] == "pending"]
    assert pending["held_events"] == [{"stream": demo.COMM, "must_fire": True}]
    assert any(b["state"] == "live" and b["use_events"] == [{"stream": demo.SIDE, "kind": "record_use"}]
               for b in blocks)


@needs_trace
def test_demo_trace_shows_record_use_releasing_before_record_stream(sim_shim):
    rec = run_demo(capacity=1 << 16).recording
    built = lives.build(rec.events, rec.shim_findings)
    first, second = built.blocks[0], built.blocks[1]
    assert first.waited_streams() == [(demo.COMM, ["record_use"])]
    assert second.waited_streams() == [(demo.COMM, ["record_stream"])]
    # record_use's event had fired by the free; record_stream's was recorded at the free
    assert second.reusable is not None and second.reusable > second.free
    assert second.held_until(built.end) - second.free > (first.held_until(built.end) or first.free) - first.free
    assert memory_viz.replay_problems(memory_viz.build(rec.snapshot, built, rec.frames)) == []
    alloc_frames = rec.frames[first.alloc]
    assert alloc_frames[0]["filename"].endswith("viz/demo.py") and alloc_frames[0]["name"] == "run"


def test_a_script_on_the_simulated_device_says_why_it_shows_no_block(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, forgotten_handoff())
    assert main(["snapshot", "--device", "sim", path]) == 0
    out = capsys.readouterr().out
    assert "a script's tensors are CPU tensors, which the shim does not allocate" in out
    assert "npu-lifetime snapshot --demo" in out
    assert "CPU tensors, which the shim does not allocate" in (tmp_path / "prog.snapshot.html").read_text()


def test_sanitizer_findings_reach_the_timeline(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, forgotten_handoff())
    assert main(["snapshot", "--device", "sim", "--sanitize", path]) == 1  # a latent uncovered free fails, as in check
    capsys.readouterr()
    html = (tmp_path / "prog.snapshot.html").read_text()
    assert "<tr><td>sanitizer</td>" in html and "[uncovered free" in html


def test_sanitize_prints_the_sanitizers_summary_and_exits_as_check_does(tmp_path, capsys, sim_shim):
    from helpers.scripts import REUSED  # an actual reuse race on the simulated device

    path = write_script(tmp_path, REUSED)
    assert main(["check", "--device", "sim", path]) == 1
    check_out = capsys.readouterr().out
    assert main(["snapshot", "--device", "sim", "--sanitize", path]) == 1  # it exited 0
    captured = capsys.readouterr()
    report = check_out[check_out.index("npu_lifetime: "):]
    assert report.splitlines()[0] in captured.out  # "npu_lifetime: 2 finding(s): 2 fail the check" (it printed none)
    assert "[reuse race]" in captured.out and "[uncovered free, ACTUAL" in captured.out
    assert (tmp_path / "prog.snapshot.html").exists()  # the pictures are still written
    # --json: the findings join the JSON on stdout; the summary goes to stderr
    assert main(["snapshot", "--device", "sim", "--sanitize", "--json", "--no-files", path]) == 1
    captured = capsys.readouterr()
    document = json.loads(captured.out[captured.out.index("{"):])
    assert {f["kind"] for f in document["sanitizer"]["findings"]} >= {"reuse_race", "uncovered_free"}
    assert document["sanitizer"]["failing"] == 2 and "[reuse race]" in captured.err


def test_sanitize_with_a_failing_script_exits_3_as_check_does(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, "raise ValueError('boom')")
    assert main(["snapshot", "--device", "sim", "--sanitize", path]) == 3
    captured = capsys.readouterr()
    assert "npu_lifetime: no findings" in captured.out
    assert "npu-lifetime snapshot: the script raised ValueError: boom" in captured.err


def test_a_failing_script_exits_3_and_still_writes(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, """
        from npu_lifetime import shim
        p = shim.alloc(4096, 0, 0x10)
        raise RuntimeError("boom")
    """)
    assert main(["snapshot", "--device", "sim", path]) == 3
    captured = capsys.readouterr()
    assert "RuntimeError: boom" in captured.err and "live 1 blocks / 4096 B" in captured.out
    assert (tmp_path / "prog.snapshot.pickle").exists() and (tmp_path / "prog.snapshot.html").exists()


@pytest.mark.parametrize("argv, message", [
    ([], "give a script to run, or --demo (not both)"),
    (["--demo", "x.py"], "give a script to run, or --demo (not both)"),
    (["missing.py"], "no such script: missing.py"),
    (["--trace-capacity", "0", "--demo"], "argument --trace-capacity: must be at least 1, not 0"),
])
def test_bad_input_is_a_clear_error(argv, message, capsys, sim_shim):
    assert main(["snapshot", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_device_the_machine_lacks_is_an_error(tmp_path, capsys):
    path = write_script(tmp_path, "print('ran')")
    assert main(["snapshot", "--device", "cuda", path]) == 2
    captured = capsys.readouterr()
    assert "--device cuda: install('cuda') needs a CUDA device" in captured.err and "ran" not in captured.out
    assert not (tmp_path / "prog.snapshot.pickle").exists()


def test_no_files_prints_only(tmp_path, capsys, sim_shim):
    path = write_script(tmp_path, "from npu_lifetime import shim\np = shim.alloc(512, 0, 0x10)\n")
    assert main(["snapshot", "--device", "sim", "--no-files", path]) == 0
    assert "wrote" not in capsys.readouterr().out
    assert not (tmp_path / "prog.snapshot.pickle").exists()


def test_json_output(tmp_path, capsys, sim_shim):
    import json

    path = write_script(tmp_path, "from npu_lifetime import shim\np = shim.alloc(512, 0, 0x10)\n")
    assert main(["snapshot", "--device", "sim", "--no-files", "--json", path]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stats"]["allocation.all.current"] == 1 and data["snapshot"]["runtime"] == "sim"
    assert data["trace"][-1]["kind"] == "alloc" and data["trace"][-1]["size"] == 512


@needs_trace
def test_frames_leave_out_the_launcher_and_the_standard_library(sim_shim):
    import os
    import sysconfig

    rec = run_demo(capacity=1 << 16).recording
    assert rec.frames and all(frames[0]["filename"].endswith(os.path.join("viz", "demo.py"))
                              for frames in rec.frames.values())
    files = {f["filename"] for frames in rec.frames.values() for f in frames}
    paths = sysconfig.get_paths()
    assert not any(f.startswith((paths["scripts"], paths["stdlib"] + os.sep)) for f in files)


@needs_trace
def test_frames_from_the_console_script_leave_out_its_launcher(tmp_path):
    """Failed before: the pickle's frames ended with bin/npu-lifetime:8:<module>."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    launcher = Path(sys.executable).parent / "npu-lifetime"
    if not launcher.exists():
        pytest.skip("the npu-lifetime console script is not installed beside this python")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    done = subprocess.run([str(launcher), "snapshot", "--demo", "--out", str(tmp_path / "d")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "d.pickle", "rb") as f:
        data = pickle.load(f)
    files = {fr["filename"] for e in data["device_traces"][0] for fr in e["frames"]}
    assert any(f.endswith("demo.py") for f in files)
    assert not any(f == str(launcher) for f in files)


def test_a_script_imports_modules_beside_it_as_under_python(tmp_path, capsys, sim_shim):
    # runpy alone does not put the script's directory on sys.path: this import failed (exit 3)
    (tmp_path / "helper_beside.py").write_text("VALUE = 41\n")
    path = write_script(tmp_path, "import helper_beside\nprint('value', helper_beside.VALUE + 1)\n")
    out_dir = tmp_path / "pictures"
    out_dir.mkdir()
    assert main(["snapshot", "--device", "sim", "--out", str(out_dir), path]) == 0
    assert "value 42" in capsys.readouterr().out
    # --out naming a directory writes the default names into it
    assert (out_dir / "prog.snapshot.pickle").exists() and (out_dir / "prog.snapshot.html").exists()
