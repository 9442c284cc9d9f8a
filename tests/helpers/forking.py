"""Waiting for a forked child with a deadline: one that deadlocks is killed,
not waited for forever."""
import os
import time


def child_exit_code(pid: int, timeout: float = 10.0):
    """The forked child PID's exit code, or None when it had not exited
    within TIMEOUT seconds (it is then killed and reaped)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None
