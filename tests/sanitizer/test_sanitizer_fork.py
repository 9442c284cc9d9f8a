"""fork() while another thread is inside the sanitizer (issue 36, item 5):
the child must run on (3 of 40 children died or hung on the sanitizer's
lock before; 2 of 200 here).  Each child makes an op under the sanitizer
and reads its findings, with a worker thread busy in the sanitizer in the
parent; 0 of 200 may hang or die.  Run in a fresh interpreter: forking
pytest's own process with a busy thread is not this test's business.

A child counts as hung after 30 s (a deadlock never resolves; a child that
only started slowly on a loaded 2-core machine must not count: CI once saw
1 of 200 past the former 10 s), and a hung child first writes where each of
its threads stands, which the failure prints."""
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import faulthandler, os, sys, tempfile, threading, time, torch
    from npu_lifetime import simdevice as sd
    from npu_lifetime.sanitizer import LifetimeSanitizer
    N = int(sys.argv[1])
    san = LifetimeSanitizer("sim", on_race="collect", warn_on_free=False).enable()
    stop = False
    def busy():
        side = sd.Stream()
        while not stop:
            x = torch.ones(8)
            side.wait_stream(sd.default_stream())
            with sd.stream(side):
                y = x * 2
            del x, y
    worker = threading.Thread(target=busy)
    worker.start()
    bad = 0
    dumps = tempfile.mkdtemp()
    for _ in range(N):
        pid = os.fork()
        if pid == 0:
            faulthandler.dump_traceback_later(25, exit=True, file=open(os.path.join(dumps, str(os.getpid())), "w"))
            z = torch.ones(4) + 1
            _ = san.findings
            os._exit(0)
        deadline = time.time() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                bad += not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
                break
            if time.time() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                bad += 1
                break
            time.sleep(0.002)
    stop = True
    worker.join()
    san.disable()
    for name in os.listdir(dumps):
        text = open(os.path.join(dumps, name)).read()
        if text:
            print("child", name, "hung:", text, file=sys.stderr)
    print("bad", bad)
""")


def test_200_forks_beside_a_busy_sanitizer_all_run_on():
    done = subprocess.run([sys.executable, "-c", PROGRAM, "200"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["bad", "0"], done.stdout[-500:] + done.stderr[-6000:]
