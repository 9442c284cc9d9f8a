"""A simulated stream device for CPU tensors.

Streams and events here have the API of ``torch.cuda``'s (``stream()``,
``current_stream()``, ``Stream.wait_stream``, ``Event.record/wait/
synchronize/query``, ``synchronize()``), but CPU work runs at once: they
exist so that stream code can be written, sanitized and fuzzed on a machine
without an accelerator.  Listeners (the lifetime sanitizer) are told of every
stream, event and synchronisation, as torch's GPU trace tells CSAN.

Like CUDA, an op that reads device data back to the host (``.item()``,
``float(t)``, ``nonzero()``, ``masked_select``, ``unique``, boolean-mask
indexing...) synchronises the host with the current stream after its
kernels: the sanitizer's dispatch mode calls ``op_ran`` for each op (CPU ops
have no other hook), and such an op notifies a stream synchronisation.
Autograd's stream semantics are CUDA's (``autograd_streams``): each backward
op runs on the stream its forward op ran on, after waiting for the streams
that produced its input gradients (the caller's stream for the initial
gradient), which are recorded on its stream (``record_stream``, as the
engine does), and the caller's stream waits for the backward's streams when
``backward()`` / ``autograd.grad()`` returns.

Every tensor is host memory, so the copies to the host that a CUDA program
relies on (``.tolist()``, ``.cpu()``, ``.numpy()``) dispatch nothing: the
sanitizer's simulated backend takes each as a read on the current stream
followed by a host wait, as a blocking copy is on CUDA.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from typing import Optional

DEVICE_INDEX = 0
_handles = itertools.count(1)
_listeners: list = []
_state = threading.local()


def add_listener(listener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def remove_listener(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _notify(name: str, *args) -> None:
    for listener in list(_listeners):
        getattr(listener, name)(*args)


def _describe(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, Stream):
        return f"the stream {value!r}"
    if isinstance(value, Event):
        return f"the event {value!r}"
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if name.startswith("torch.") and name.endswith("Stream"):  # torch.cuda.Stream, torch.Stream: one name
        return f"{name.rsplit('.', 1)[0].replace('torch._C', 'torch')}.Stream"
    return f"{name} {value!r}"


def _check_stream(value, call: str, none_ok: bool) -> None:
    """A bad stream fails here with what to pass, not later deep in a
    listener (``'str' object has no attribute 'key'``)."""
    if isinstance(value, Stream) or (none_ok and value is None):
        return
    hint = ""
    if isinstance(value, str):
        hint = ": make the stream once with simdevice.Stream() and pass it"
    elif isinstance(value, Event):
        hint = ": to wait for an event, use wait_event"
    elif _describe(value).startswith("torch"):
        hint = ": a torch stream is for device tensors; CPU tensors take a simdevice.Stream()"
    either = " or None" if none_ok else ""
    raise TypeError(f"{call} takes a simdevice Stream (npu_lifetime.simdevice.Stream()){either}, "
                    f"not {_describe(value)}{hint}")


def _check_event(value, call: str, none_ok: bool) -> None:
    if isinstance(value, Event) or (none_ok and value is None):
        return
    hint = ": to wait for a stream, use wait_stream" if isinstance(value, Stream) else ""
    either = " or None" if none_ok else ""
    raise TypeError(f"{call} takes a simdevice Event (npu_lifetime.simdevice.Event()){either}, "
                    f"not {_describe(value)}{hint}")


class Stream:
    """A simulated stream; handle 0 is the default stream."""

    def __init__(self, _handle: Optional[int] = None) -> None:
        self.handle = next(_handles) if _handle is None else _handle
        self.device_index = DEVICE_INDEX
        if _handle is None:
            _notify("on_stream_created", self.key)

    @property
    def key(self) -> tuple:
        return (self.device_index, self.handle)

    def wait_stream(self, other: "Stream") -> None:
        _check_stream(other, "Stream.wait_stream", none_ok=False)
        self.wait_event(other.record_event())

    def wait_event(self, event: "Event") -> None:
        _check_event(event, "Stream.wait_event", none_ok=False)
        event.wait(self)

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        _check_event(event, "Stream.record_event", none_ok=True)
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        _notify("on_stream_sync", self.key)

    def query(self) -> bool:
        _notify("on_stream_sync", self.key)  # CPU work is done: the host knows it
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch asks this when a simulated stream is passed to one of its
        functions (its parser does not know the type and said only "unknown
        parameter type").  Real streams never come here, so torch behaves as
        before for them."""
        if getattr(func, "__name__", None) == "record_stream":
            raise TypeError("Tensor.record_stream takes a torch stream (torch.cuda.Stream, torch.npu.Stream); for a "
                            "simdevice stream call npu_lifetime.record_stream(tensor, stream), which the simulated "
                            "device and the sanitizer understand")
        return NotImplemented

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other.handle == self.handle

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return "<sim default stream>" if self.handle == 0 else f"<sim stream {self.handle}>"


class Event:
    def __init__(self) -> None:
        self.handle = next(_handles)
        self.recorded = False
        _notify("on_event_created", self.handle)

    def record(self, stream: Optional[Stream] = None) -> None:
        _check_stream(stream, "Event.record", none_ok=True)
        stream = stream or current_stream()
        self.recorded = True
        _notify("on_event_record", self.handle, stream.key)

    def wait(self, stream: Optional[Stream] = None) -> None:
        _check_stream(stream, "Event.wait", none_ok=True)
        stream = stream or current_stream()
        _notify("on_event_wait", self.handle, stream.key)

    def synchronize(self) -> None:
        _notify("on_event_sync", self.handle)

    def __repr__(self) -> str:
        return f"<sim event {self.handle}>"

    def query(self) -> bool:
        if self.recorded:
            _notify("on_event_sync", self.handle)
        return True

    def __del__(self) -> None:
        try:
            _notify("on_event_deleted", self.handle)
        except Exception:  # interpreter shutdown
            pass


_DEFAULT = Stream(_handle=0)


def default_stream() -> Stream:
    return _DEFAULT


def current_stream() -> Stream:
    return getattr(_state, "stream", _DEFAULT)


def set_stream(stream: Stream) -> None:
    _check_stream(stream, "simdevice.set_stream", none_ok=False)
    _state.stream = stream


def stream(s: Optional[Stream]):
    """Makes ``s`` the current stream inside the block (like torch.cuda.stream)."""
    _check_stream(s, "simdevice.stream", none_ok=True)
    return _in_stream(s)


@contextlib.contextmanager
def _in_stream(s: Optional[Stream]):
    if s is None:
        yield
        return
    previous = current_stream()
    set_stream(s)
    try:
        yield
    finally:
        set_stream(previous)


def synchronize() -> None:
    _notify("on_device_sync", DEVICE_INDEX)


_read_back: dict = {}  # id(op) -> (op, True / False / "mask" (boolean-mask indexing only))


def reads_back_to_host(func, args: tuple) -> bool:
    """Whether CUDA synchronises the host after ``func``: ops whose outputs
    depend on the data's values (torch tags them ``data_dependent_output``
    or ``dynamic_output_shape``), boolean-mask indexing among ``index``'s
    forms, and ``equal``."""
    entry = _read_back.get(id(func))  # ops hash in Python, ids do not
    if entry is None or entry[0] is not func:
        entry = _read_back[id(func)] = (func, _read_back_kind(func))
    kind = entry[1]
    if kind == "mask":
        import torch

        indices = args[1] if len(args) > 1 else ()
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return kind


def _read_back_kind(func):
    import torch

    tags = func.tags
    if torch.Tag.data_dependent_output in tags:
        return True
    if torch.Tag.dynamic_output_shape in tags:
        # only a boolean mask makes index's output shape depend on the data
        return "mask" if func._schema.name == "aten::index" else True
    return func._schema.name == "aten::equal"


def op_ran(func, args: tuple) -> None:
    """Called after each op on simulated-device tensors: an op that reads
    data back to the host synchronises it with the current stream."""
    if reads_back_to_host(func, args):
        current_stream().synchronize()


# -- autograd's stream semantics ----------------------------------------------------------------------------------
_forward_streams: OrderedDict = OrderedDict()  # autograd node sequence number -> the stream its forward ran on
_FORWARD_STREAMS_KEPT = 1 << 16


class _BackwardPass:
    """One ``backward()`` / ``autograd.grad()`` call on this thread."""

    __slots__ = ("caller", "used", "pending", "watched", "handles")

    def __init__(self, caller: Stream) -> None:
        self.caller = caller
        self.used: set = set()  # streams the backward ran on
        self.pending: dict = {}  # node -> streams that produced its input gradients
        self.watched: set = set()  # nodes given the pre-hook below
        self.handles: list = []  # the pre-hooks, removed when the call returns


def op_starting() -> None:
    """Called by the sanitizer's dispatch mode before each op: in a forward,
    notes the stream of the autograd node the op's autograd kernel just made
    (the node's sequence number is the last one handed out on this thread)."""
    import torch

    if torch._C._current_autograd_node() is not None:
        return  # a backward op: its node's pre-hook chose its stream
    seq = torch._C._autograd._get_sequence_nr() - 1
    if seq >= 0 and seq not in _forward_streams:
        _forward_streams[seq] = current_stream()
        if len(_forward_streams) > _FORWARD_STREAMS_KEPT:
            _forward_streams.popitem(last=False)


def _watch(bw: _BackwardPass, node) -> None:
    if node is None or node in bw.watched:
        return
    bw.watched.add(node)
    bw.handles.append(node.register_prehook(lambda grads, node=node: _enter(bw, node, grads)))


def _enter(bw: _BackwardPass, node, grads) -> None:
    """The engine is about to run ``node`` (a pre-hook: its input gradients
    are ready): on its forward's stream (a node with no forward op, e.g.
    AccumulateGrad, on its gradient's producer's), after waiting for the
    streams that produced its input gradients (for a root, the caller's;
    with none known, every stream used so far); each gradient is recorded
    on that stream (``record_stream``), as the engine's input buffer does."""
    producers = bw.pending.pop(node, None)
    stream = _forward_streams.get(node._sequence_nr())
    if stream is None:
        stream = next(iter(producers)) if producers else bw.caller
    for producer in producers if producers else (bw.used | {bw.caller}):
        if producer != stream:
            stream.wait_stream(producer)
    import torch

    for grad in grads:
        if isinstance(grad, torch.Tensor) and grad.is_cpu:
            _notify("record_stream", grad, stream.key)
    bw.used.add(stream)
    set_stream(stream)
    for next_node, _ in node.next_functions:
        if next_node is not None:
            bw.pending.setdefault(next_node, set()).add(stream)
            _watch(bw, next_node)


def _roots(args: tuple, kwargs: dict, name: str) -> tuple:
    import torch

    value = args[0] if args else kwargs.get("tensors" if name == "backward" else "outputs")
    tensors = (value,) if isinstance(value, torch.Tensor) else tuple(value or ())
    return tuple(t.grad_fn for t in tensors if isinstance(t, torch.Tensor) and t.grad_fn is not None)


def _autograd_entry(original, name: str):
    def run(*args, **kwargs):
        caller = current_stream()
        passes = _state.__dict__.setdefault("backward", [])
        bw = _BackwardPass(caller)
        passes.append(bw)
        try:
            for root in _roots(args, kwargs, name):
                _watch(bw, root)
            return original(*args, **kwargs)
        finally:
            passes.pop()
            for handle in bw.handles:
                handle.remove()
            set_stream(caller)
            for stream in bw.used:  # the caller's stream waits for the backward's (the engine's final sync)
                if stream != caller:
                    caller.wait_stream(stream)

    run._npu_lifetime_original = original
    run.__doc__, run.__name__ = original.__doc__, original.__name__
    return run


def autograd_streams() -> None:
    """Gives ``torch.autograd.backward`` / ``grad`` (and so
    ``Tensor.backward``) CUDA's stream semantics on the simulated device
    (once per process): pre-hooks on the graph's nodes move each node's ops
    to its forward's stream, with the engine's waits and record_stream."""
    import torch.autograd

    for name in ("backward", "grad"):
        function = getattr(torch.autograd, name)
        if not hasattr(function, "_npu_lifetime_original"):
            setattr(torch.autograd, name, _autograd_entry(function, name))
