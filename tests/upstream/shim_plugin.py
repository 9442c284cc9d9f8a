"""pytest plugin for torch's own tests under either allocator (issue 16).

Loaded with ``-p shim_plugin`` by ``run_suites.py``.  The allocator comes
from ``NPU_LIFETIME_UPSTREAM_ALLOCATOR``:

- ``shim``: ``npu_lifetime.install("cuda")`` in ``pytest_configure``, before
  any test module is imported (so before torch's tests allocate anything);
  after every test the shim's findings are drained and kept under the test's
  id.  An install that fails stops the run (a "shim" run on torch's
  allocator would compare nothing).
- ``native`` (or unset): nothing is installed; only the allocator backend is
  recorded, so the two runs' reports read alike.

Each finished test is appended to ``$NPU_LIFETIME_UPSTREAM_OUT/results.jsonl``
as it ends (a run killed by the suite timeout still leaves the tests it
finished, and the test it was in is the last "start" line without an end),
and ``report.json`` there gets the backend, versions and findings at the end.
After collection and selection, a ``collected`` line lists the node ids this
process will run (``run_suites.py`` counts what is left from it when it
restarts a process after a failure).  torch is only looked at when a test
module imported it (a synthetic suite of the runner's own tests runs without
it).
"""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

ENV_ALLOCATOR = "NPU_LIFETIME_UPSTREAM_ALLOCATOR"
ENV_OUT = "NPU_LIFETIME_UPSTREAM_OUT"
# a pytest -k style expression matched against the test's class and test
# names only: pytest's own -k also matches the names of the folders above
# the file, and ".gl/upstream" holds "stream"
ENV_SELECT = "NPU_LIFETIME_UPSTREAM_SELECT"
# =1: go on from results.jsonl: tests that ended there are not run again,
# nor a test that started twice without ending (it hangs or outlives the
# run's timeout); the earlier findings are kept
ENV_RESUME = "NPU_LIFETIME_UPSTREAM_RESUME"

_state = {"allocator": "native", "installed": None, "findings": {}, "out": None, "started": time.time(),
          "error": None}


def _out_path(name: str):
    out = _state["out"]
    return os.path.join(out, name) if out else None


def _append(record: dict) -> None:
    path = _out_path("results.jsonl")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(record) + "\n")


def pytest_configure(config) -> None:
    allocator = os.environ.get(ENV_ALLOCATOR, "native").strip().lower() or "native"
    if allocator not in ("shim", "native"):
        raise pytest.UsageError(f"{ENV_ALLOCATOR} must be 'shim' or 'native', not {allocator!r}")
    _state["allocator"] = allocator
    _state["out"] = os.environ.get(ENV_OUT) or None
    if _state["out"]:
        os.makedirs(_state["out"], exist_ok=True)
        if os.environ.get(ENV_RESUME) == "1":
            _load_earlier_findings()
    if allocator == "shim":
        import npu_lifetime

        try:
            installed = npu_lifetime.install("cuda")
        except Exception as err:  # noqa: BLE001 - reported, then the run stops
            _state["error"] = f"npu_lifetime.install('cuda') failed: {err!r}"
            _write_report()
            raise pytest.UsageError(f"shim run: npu_lifetime.install('cuda') failed: {err!r}") from err
        _state["installed"] = repr(installed)


def selected(nodeid: str, expression: str) -> bool:
    """Whether ``expression`` (pytest -k syntax: and/or/not, parentheses,
    case-insensitive substrings) holds for the node id's class and test
    names, the file path left out."""
    from _pytest.mark.expression import Expression

    names = [part.lower() for part in nodeid.split("::")[1:]]

    def matcher(ident: str, **_kwargs) -> bool:
        ident = ident.lower()
        return any(ident in name for name in names)

    return Expression.compile(expression).evaluate(matcher)


def _load_earlier_findings() -> None:
    path = _out_path("report.json")
    if path and os.path.exists(path):
        try:
            with open(path) as fh:
                _state["findings"].update(json.load(fh).get("findings", {}))
        except (OSError, ValueError):
            pass


def finished_earlier(path) -> set:
    """Node ids results.jsonl shows ended (or ``killed``: run_suites.py
    killed the process for the test's own timeout, or the process died in
    it), or started twice without ending."""
    ended, starts = set(), {}
    if path and os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") in ("end", "killed"):
                    ended.add(record.get("nodeid"))
                elif record.get("event") == "start":
                    starts[record.get("nodeid")] = starts.get(record.get("nodeid"), 0) + 1
    return ended | {nodeid for nodeid, count in starts.items() if count >= 2 and nodeid not in ended}


def pytest_collection_modifyitems(config, items) -> None:
    expression = os.environ.get(ENV_SELECT, "").strip()
    done = finished_earlier(_out_path("results.jsonl")) if os.environ.get(ENV_RESUME) == "1" else set()
    if not expression and not done:
        return
    keep, drop = [], []
    for item in items:
        wanted = (not expression or selected(item.nodeid, expression)) and item.nodeid not in done
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session) -> None:
    # what this process will run, after every plugin's selection
    _append({"event": "collected", "nodeids": [item.nodeid for item in session.items]})


def _drain_findings() -> list:
    if _state["allocator"] != "shim":
        return []
    try:
        from npu_lifetime import shim

        return shim.findings()
    except Exception as err:  # noqa: BLE001
        return [{"kind": "plugin-error", "op": "findings", "address": 0, "error": repr(err)}]


def pytest_runtest_logstart(nodeid, location) -> None:
    _append({"event": "start", "nodeid": nodeid, "t": time.time()})


def pytest_runtest_logreport(report) -> None:
    # one line per phase that decides the outcome: a failed/skipped setup, the
    # call, a failed teardown
    if report.when == "call" or report.outcome != "passed":
        record = {"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                  "duration": round(report.duration, 3)}
        if hasattr(report, "wasxfail"):
            record["xfail"] = True
        if report.outcome != "passed":
            text = getattr(report, "longreprtext", "") or ""
            record["message"] = _head(text)
        _append(record)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location) -> None:
    found = _drain_findings()
    if found:
        _state["findings"][nodeid] = found
    _append({"event": "end", "nodeid": nodeid, "findings": len(found)})


def _head(text: str, lines: int = 12, chars: int = 2000) -> str:
    """The end of a pytest failure text holds the error; keep its last lines."""
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-chars:]


def _torch():
    """torch when a test module imported it, else None (importing it here
    only for the report would cost seconds a process)."""
    return sys.modules.get("torch")


def _backend() -> str:
    if _torch() is None:
        return "torch not imported"
    try:
        import torch

        if not torch.cuda.is_available():
            return "no-cuda"
        return str(torch.cuda.get_allocator_backend())
    except Exception as err:  # noqa: BLE001
        return f"unknown ({err!r})"


def _write_report() -> None:
    path = _out_path("report.json")
    if not path:
        return
    try:
        torch = _torch()
        versions = ({"torch": torch.__version__, "cuda": torch.version.cuda} if torch is not None
                    else {"torch": "not imported"})
    except Exception as err:  # noqa: BLE001
        versions = {"torch": f"unreadable ({err!r})"}
    report = {
        "allocator": _state["allocator"],
        "allocator_backend": _backend(),
        "installed": _state["installed"],
        "error": _state["error"],
        "python": sys.version.split()[0],
        "versions": versions,
        "elapsed_s": round(time.time() - _state["started"], 1),
        "findings": _state["findings"],
        "finding_count": sum(len(v) for v in _state["findings"].values()),
    }
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1, default=repr)


def pytest_unconfigure(config) -> None:
    found = _drain_findings()  # anything left after the last test (module teardown, gc)
    if found:
        _state["findings"].setdefault("<session end>", []).extend(found)
    _write_report()
