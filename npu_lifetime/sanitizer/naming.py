"""Names a user can paste: tensors and streams as the program wrote them.

A stream is named by the variable its constructor call was assigned to
(``side = torch.cuda.Stream()`` -> ``side``), read from the source line of
the user frame that created it, and only when that line calls the
constructor itself; the default stream by the call that returns it on
its device.  A tensor is named by the variable at its allocation site (``y =
x * 2`` -> ``y``), else by that site.  Fixes use calls that run on the
device in question: ``x.record_stream(s)`` on CUDA and NPU,
``npu_lifetime.record_stream(x, s)`` on the simulated device (whose CPU
tensors' ``Tensor.record_stream`` refuses its streams).
"""
from __future__ import annotations

import ast
import functools
import linecache
import re
from typing import Optional

_TARGET = re.compile(r"^\s*(?:with\b.*\bas\s+)?([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*(?::[^=]*)?=(?!=)")
_WITH_AS = re.compile(r"\bas\s+([A-Za-z_]\w*)\s*:")


def _source_line(site) -> Optional[tuple]:
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    if not frames:
        return None
    filename, line, _ = frames[0]
    return filename, line, linecache.getline(filename, line)


def assigned_names(site) -> tuple:
    """The names the statement at ``site``'s innermost user frame assigns
    (``a, b = ...`` -> ``("a", "b")``; ``with ... as s:`` -> ``("s",)``)."""
    found = _source_line(site)
    if found is None:
        return ()
    text = found[2]
    match = _TARGET.match(text)
    if match and "==" not in text[:match.end()]:
        return tuple(name.strip() for name in match.group(1).split(","))
    match = _WITH_AS.search(text)
    return (match.group(1),) if match else ()


def _constructs_stream(node) -> bool:
    """``torch.cuda.Stream(...)``, ``sd.Stream()``, ``ExternalStream(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name.endswith("Stream")


def _bound_pairs(statement) -> list:
    """(target, value) pairs a one-line assignment or ``with`` binds."""
    if isinstance(statement, ast.With):
        return [(item.optional_vars, item.context_expr) for item in statement.items if item.optional_vars]
    if isinstance(statement, ast.Assign):
        target, value = statement.targets[-1], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, value = statement.target, statement.value
    else:
        return []
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return list(zip(target.elts, value.elts))
    return [(target, value)]


def stream_names(site) -> tuple:
    """The names the statement at ``site`` binds to streams it constructs
    itself (``a, b = S(), S()`` -> ``("a", "b")``; ``with S() as s:`` ->
    ``("s",)``).  A stream made inside a call the statement does not spell
    out as a stream's constructor (a library creating its streams lazily
    during ``loss = net(x)``; ``[S() for ...]``) gets no name: the assigned
    variable does not hold that stream."""
    found = _source_line(site)
    return () if found is None else _stream_names_in(found[2].strip())


@functools.lru_cache(maxsize=1024)
def _stream_names_in(text: str) -> tuple:
    """``stream_names`` of one source line (parsed once per distinct line:
    on NPU every ``Stream(...)`` object torch_npu makes, ``current_stream()``'s
    included, asks)."""
    try:
        statement = ast.parse(text + (" pass" if text.endswith(":") else "")).body[0]
    except (SyntaxError, IndexError):  # a statement spread over several lines
        return ()
    return tuple(ast.unparse(target) for target, value in _bound_pairs(statement)
                 if isinstance(target, (ast.Name, ast.Attribute)) and _constructs_stream(value))


def _is_op(node) -> bool:
    if isinstance(node, ast.UnaryOp):
        return not isinstance(node.operand, ast.Constant)  # -1 is a number, not an op
    return isinstance(node, (ast.Call, ast.BinOp, ast.Compare))


def _makes_one_tensor(site) -> bool:
    """Whether the storage allocated at ``site`` can only be the value its
    statement assigns: the statement is one op (``y = x * 2``, ``w =
    torch.ones(8)``), called from the line itself or through at most one
    library function (``y = F.relu(x)``).  Otherwise the allocation may be
    an intermediate (``y = a * b + c``) or a library's own buffer (FSDP2's
    all-gather output, allocated inside ``loss = net(x).sum()``), which the
    assigned variable does not hold."""
    if len(getattr(site, "library", ())) > 1:
        return False
    found = _source_line(site)
    if found is None:
        return False
    try:
        statement = ast.parse(found[2].strip()).body[0]
    except (SyntaxError, IndexError):  # a statement spread over several lines
        return False
    pairs = _bound_pairs(statement)
    return len(pairs) == 1 and sum(map(_is_op, ast.walk(pairs[0][1]))) == 1


def where(site) -> str:
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    if not frames:
        return str(site) if site is not None else "<no stack>"
    filename, line, _ = frames[0]
    return f"{filename.rsplit('/', 1)[-1]}:{line}"


class Names:
    """How one sanitizer names streams (in prose and in code) and tensors."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self._streams: dict = {}  # stream key -> the variable it was assigned to
        self._per_line: dict = {}  # (file, line) -> streams created there so far

    # -- streams ----------------------------------------------------------------
    def named(self, key: tuple) -> bool:
        return key in self._streams

    def note_stream(self, key: tuple, site) -> None:
        """A stream was created at ``site``."""
        if key in self._streams:
            return
        names = stream_names(site)
        if not names:
            return
        found = _source_line(site)
        where_key = found[:2] if found else None
        index = self._per_line.get(where_key, 0)
        self._per_line[where_key] = index + 1
        self._streams[key] = names[index % len(names)]

    def __call__(self, key) -> str:
        """A stream in prose: the backend's description and its variable."""
        text = self.backend.describe(key)
        code = self._streams.get(key) or (self.stream_code(key) if key[1] != 0 else None)
        return f"{text} (`{code}`)" if code else text

    def stream_code(self, key) -> Optional[str]:
        """An expression for the stream, or None when there is none (a
        stream whose creation was not seen, a collective's own stream)."""
        code = self._streams.get(key)
        if code:
            return code
        device, handle = key
        if handle == 0 or key == self._default_stream(device):
            return {"cpu": "npu_lifetime.simdevice.default_stream()",
                    "cuda": f"torch.cuda.default_stream({device})",
                    "npu": f"torch.npu.default_stream({device})"}.get(self.backend.device_type)
        return None

    def _default_stream(self, device: int) -> Optional[tuple]:
        """The device's default stream key, where its handle is not 0 (NPU)."""
        try:
            return self.backend.default_stream(device)
        except Exception:  # a backend that cannot say: no name rather than a wrong one
            return None

    def stream_arg(self, key) -> str:
        """The stream as an argument in a fix: its expression, or a
        placeholder that says which stream to put there."""
        code = self.stream_code(key)
        return code if code else f"<{self.backend.describe(key)}>"

    def is_collective(self, key) -> bool:
        return self.backend.device_type == "cpu" and key[1] < 0

    # -- tensors ------------------------------------------------------------------
    def tensor(self, alloc_site) -> tuple:
        """``(code, known)``: the variable the tensor was assigned to at its
        allocation, else ``x`` (not known: the report says where it was
        allocated)."""
        names = assigned_names(alloc_site)
        if len(names) == 1 and _makes_one_tensor(alloc_site):
            return names[0], True
        return "x", False

    def tensor_prose(self, alloc_site) -> str:
        code, known = self.tensor(alloc_site)
        if known:
            return f"`{code}` (allocated at {where(alloc_site)})"
        return f"the tensor allocated at {where(alloc_site)}"

    def record_stream(self, tensor: str, stream: str) -> str:
        if self.backend.device_type == "cpu":
            return f"npu_lifetime.record_stream({tensor}, {stream})"
        return f"{tensor}.record_stream({stream})"
