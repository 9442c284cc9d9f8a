"""c10d collectives as accesses: which arguments a collective reads and
writes, the stream its backend runs it on, and how ``work.wait()`` orders it
for the user.

* Semantics: the ``c10d::*`` ops' schemas do not annotate writes (``recv_``,
  ``alltoall_base_``... look like reads), so each op's written arguments
  are listed here; every other tensor argument is read.
* Stream: a backend with streams of its own (NCCL, HCCL) launches an async
  collective on its stream after making it wait for the current one; the
  device trace shows that wait inside the op, so the collective's accesses
  go on the first stream that waits inside it (``lifetime.op_order``).  A
  collective with no wait inside runs on the current stream (NCCL runs
  synchronous collectives there), except on the simulated device, where
  gloo runs it on threads of its own: a stream of the process group's own,
  ordered after the current stream at the launch.
* Ordering: a collective on a process group's own stream ends with an
  event on it; ``Work.wait()`` (called by ``async_op=False`` too) is then a
  host wait for that event and ``Work.block_current_stream()`` a wait of
  the current stream.  On CUDA/NPU the backend's own events do this and the
  trace reports them.  The host also waits through the work's future
  (``work.get_future().wait()``, ``torch.futures.wait_all``,
  ``collect_all(...).wait()``, a ``done()`` that returned True) or by polling ``work.is_completed()`` until True.
  ``Work.wait``, ``block_current_stream``, ``get_future``, ``is_completed``
  ``torch.Future.wait`` / ``done`` and ``torch.futures.collect_all`` /
  ``wait_all`` are wrapped once, on the first
  collective seen; nothing else depends on it.
  A gloo collective issued from C++ (DDP's reducer, ``_broadcast_coalesced``)
  is waited for in C++, where nothing reports the wait: it is taken as
  ordered on the current stream (its accesses are still checked there);
  only collectives issued through ``torch.distributed``'s Python API, whose
  Work comes back to Python, run on the group's own stream.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Callable, Optional

# op -> the arguments it writes (every other tensor argument is read)
_WRITES = {
    "c10d::allreduce_": ("tensors",),
    "c10d::allreduce_coalesced_": ("tensors",),
    "c10d::broadcast_": ("tensors",),
    "c10d::reduce_": ("tensors",),
    "c10d::recv_": ("tensors",),
    "c10d::recv_any_source_": ("tensors",),
    "c10d::send": (),
    "c10d::allgather_": ("output_tensors",),
    "c10d::_allgather_base_": ("output_tensor",),
    "c10d::allgather_coalesced_": ("output_lists",),
    "c10d::allgather_into_tensor_coalesced_": ("outputs",),
    "c10d::reduce_scatter_": ("output_tensors",),
    "c10d::_reduce_scatter_base_": ("output_tensor",),
    "c10d::reduce_scatter_tensor_coalesced_": ("outputs",),
    "c10d::gather_": ("output_tensors",),
    "c10d::scatter_": ("output_tensors",),
    "c10d::alltoall_": ("output_tensors",),
    "c10d::alltoall_base_": ("output",),
    "c10d::barrier": (),
    "c10d::monitored_barrier_": (),
}


def semantics(op_name: str) -> Optional[tuple]:
    """``(written argument names, None)`` for a c10d collective, else None."""
    written = _WRITES.get(op_name)
    return None if written is None else (written, None)


_groups: dict = {}  # id(ProcessGroup) -> (group, number): a stream handle per group
_groups_lock = threading.Lock()


def group_number(func, args: tuple, kwargs: dict) -> int:
    """A small number naming the collective's process group (0 if unknown)."""
    names = [a.name for a in func._schema.arguments]
    index = names.index("process_group") if "process_group" in names else -1
    value = args[index] if 0 <= index < len(args) else kwargs.get("process_group")
    if value is None:
        return 0
    try:
        from torch.distributed import ProcessGroup

        group = ProcessGroup.unbox(value)  # one Python object per C++ group
    except (ImportError, RuntimeError, TypeError):
        return 0
    with _groups_lock:
        entry = _groups.get(id(group))
        if entry is None or entry[0] is not group:
            entry = _groups[id(group)] = (group, len(_groups) + 1)
    return entry[1]


_PASSED = ("/torch/_dynamo/", "/torch/_compile.py", "/torch/utils/_python_dispatch.py", "/torch/_ops.py")


def launched_from_python_api(frame) -> bool:
    """Whether the collective being dispatched was issued through
    ``torch.distributed``'s Python API (its Work goes back to Python), as
    opposed to from C++ code that also waits for it in C++.  ``frame`` is
    the dispatch mode's frame."""
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(package) and not any(p in filename for p in _PASSED):
            return filename.endswith(os.path.join("distributed", "distributed_c10d.py"))
        frame = frame.f_back
    return False


def work_of(outputs):
    """The Work script object a collective returned, if any."""
    for value in outputs if isinstance(outputs, tuple) else (outputs,):
        if type(value).__name__ == "ScriptObject":
            return value
    return None


class _Works:
    """Works of collectives run on a process group's own stream: each maps
    to the event ending the collective, and the hub that knows that event.
    The Python Work object is kept (strongly: it is the object the caller
    gets back) until it is waited on; at most ``_MAX`` are kept."""

    _MAX = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: OrderedDict = OrderedDict()  # id(work) -> (work, event, notify)
        self._futures: OrderedDict = OrderedDict()  # id(future) -> (future, event, notify), from get_future
        self._ids = itertools.count(1)
        self._patched = False

    def new_event(self) -> tuple:
        return ("c10d work", next(self._ids))

    def track(self, script_work, event, notify: Callable) -> None:
        """``notify(name, *args)`` delivers device events to the sanitizers."""
        try:
            from torch.distributed.distributed_c10d import Work
        except ImportError:  # pragma: no cover: torch without distributed
            return
        work = Work.unbox(script_work)  # the object the caller will get (pybind keeps one per C++ Work)
        with self._lock:
            self._patch(Work)
            self._by_id[id(work)] = (work, event, notify)
            while len(self._by_id) > self._MAX:
                self._by_id.popitem(last=False)

    def _take(self, work):
        with self._lock:
            entry = self._by_id.get(id(work))
            if entry is not None and entry[0] is work:
                del self._by_id[id(work)]
                return entry
        return None

    def _entry(self, work):
        with self._lock:
            entry = self._by_id.get(id(work))
        return entry if entry is not None and entry[0] is work else None

    def _future_of(self, work, future) -> None:
        """``work.get_future()`` returned ``future``: waiting on it (or seeing
        it done) is a host wait for the work's collective."""
        entry = self._entry(work)
        if entry is not None:
            self._track_future(future, [(entry[1], entry[2])])

    def _track_future(self, future, waits: list) -> None:
        with self._lock:
            self._futures[id(future)] = (future, waits)
            while len(self._futures) > self._MAX:
                self._futures.popitem(last=False)

    def _combined(self, futures, combined) -> None:
        """``torch.futures.collect_all(futures)`` returned ``combined``: done
        when all of them are."""
        waits = []
        with self._lock:
            for future in futures:
                entry = self._futures.get(id(future))
                if entry is not None and entry[0] is future:
                    waits += entry[1]
        if waits:
            self._track_future(combined, waits)

    def _future_done(self, future, take: bool) -> None:
        with self._lock:
            entry = self._futures.get(id(future))
            if entry is None or entry[0] is not future:
                return
            if take:
                del self._futures[id(future)]
        for event, notify in entry[1]:
            notify("on_event_sync", event)

    def _patch(self, work_class) -> None:
        if self._patched:
            return
        self._patched = True
        works = self
        wait, block = work_class.wait, work_class.block_current_stream
        get_future, is_completed = work_class.get_future, work_class.is_completed
        import torch

        future_class = torch._C.Future
        future_wait, future_done = future_class.wait, future_class.done

        def work_get_future(work, *args, **kwargs):
            future = get_future(work, *args, **kwargs)
            works._future_of(work, future)
            return future

        def work_is_completed(work, *args, **kwargs):
            done = is_completed(work, *args, **kwargs)
            if done:  # polling that saw the collective done is a host wait (as Event.query)
                entry = works._entry(work)
                if entry is not None:
                    entry[2]("on_event_sync", entry[1])
            return done

        def wait_for_future(future, *args, **kwargs):
            # like Work.wait: noted before the wait
            works._future_done(future, take=True)
            return future_wait(future, *args, **kwargs)  # (torch.futures.wait_all waits on its own futures)

        def future_is_done(future, *args, **kwargs):
            done = future_done(future, *args, **kwargs)
            if done:
                works._future_done(future, take=False)
            return done

        import torch.futures as futures_module

        collect_all, wait_all = futures_module.collect_all, futures_module.wait_all

        def collect_all_futures(futures, *args, **kwargs):
            combined = collect_all(futures, *args, **kwargs)
            works._combined(list(futures), combined)
            return combined

        def wait_all_futures(futures, *args, **kwargs):
            futures = list(futures)
            for future in futures:  # each is waited for (the futures wait_all returns are new objects)
                works._future_done(future, take=True)
            return wait_all(futures, *args, **kwargs)

        work_class.get_future, work_class.is_completed = work_get_future, work_is_completed
        future_class.wait, future_class.done = wait_for_future, future_is_done
        futures_module.collect_all, futures_module.wait_all = collect_all_futures, wait_all_futures

        def wait_for_work(work, *args, **kwargs):
            # Noted before the wait: the backend's own completion steps run
            # inside it (gloo copies results into outputs there) and come after
            # the collective, like everything the host issues later.
            entry = works._take(work)
            if entry is not None:
                entry[2]("on_event_sync", entry[1])
            return wait(work, *args, **kwargs)

        def block_current_stream(work, *args, **kwargs):
            out = block(work, *args, **kwargs)
            entry = works._by_id.get(id(work))
            if entry is not None and entry[0] is work:
                entry[2]("on_current_stream_waits", entry[1])
            return out

        work_class.wait = wait_for_work
        work_class.block_current_stream = block_current_stream


WORKS = _Works()
