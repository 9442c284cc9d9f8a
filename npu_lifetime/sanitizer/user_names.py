"""Names a user can paste: tensors and streams as the program wrote them.

A name is given only where the program holds the object under it, read
from the statement of the user frame that made it when that statement sits
alone on its line: a stream by the variable its constructor call is
assigned to (``side = torch.cuda.Stream()`` -> ``side``), the default
stream by the call that returns it on its device; a tensor by the variable
its one-op statement assigns (``y = x * 2`` -> ``y``), else by its
allocation site.  Fixes use calls that run on the
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

def _site_line(site) -> Optional[tuple]:
    """``(filename, line)`` of ``site``'s innermost user frame."""
    frames = site.user_frames() if site is not None and hasattr(site, "user_frames") else []
    return frames[0][:2] if frames else None


def _header_end(node) -> int:
    """The last line of a statement, or of a ``with`` statement's header."""
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return max(n.end_lineno for item in node.items for n in (item.context_expr, item.optional_vars) if n)
    return node.end_lineno


@functools.lru_cache(maxsize=256)
def _one_line_statements(source: str) -> dict:
    """Line -> the statement that line holds alone: a simple statement or a
    ``with`` header that begins and ends on it, with no other statement on
    the line (``a = f(); b = g()`` holds two; the lines of a call spread over
    several lines hold a part of one).  Cached by the source itself, so an
    edited file parses again."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    covering: dict = {}  # line -> statements (simple or with-headers) that touch it
    for node in ast.walk(tree):
        simple = isinstance(node, ast.stmt) and not hasattr(node, "body")
        if simple or isinstance(node, (ast.With, ast.AsyncWith)):
            for line in range(node.lineno, _header_end(node) + 1):
                covering.setdefault(line, []).append(node)
    return {line: nodes[0] for line, nodes in covering.items()
            if len(nodes) == 1 and nodes[0].lineno == line == _header_end(nodes[0])}


def _statement_at(site):
    """The statement ``site``'s innermost user frame was running, when its
    line holds it alone; else None."""
    found = _site_line(site)
    if found is None:
        return None
    filename, line = found
    source = "".join(linecache.getlines(filename))
    return _one_line_statements(source).get(line) if source else None


def _bound_pairs(statement) -> list:
    """(target, value) pairs an assignment or ``with`` header binds."""
    if isinstance(statement, (ast.With, ast.AsyncWith)):
        return [(item.optional_vars, item.context_expr) for item in statement.items if item.optional_vars]
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, value = statement.targets[0], statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target, value = statement.target, statement.value
    else:
        return []
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return list(zip(target.elts, value.elts))
    return [(target, value)]


def _constructs_stream(node) -> bool:
    """``torch.cuda.Stream(...)``, ``sd.Stream()``, ``ExternalStream(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name.endswith("Stream")


def _named(target) -> bool:
    return isinstance(target, (ast.Name, ast.Attribute))


def stream_names(site) -> tuple:
    """The names the statement at ``site`` binds to the streams it
    constructs, in the order it constructs them (``a, b = S(), S()`` ->
    ``("a", "b")``; ``with S() as s:`` -> ``("s",)``), when each stream it
    constructs is bound to a name.  A stream made inside a call the
    statement does not spell out as a constructor (a library creating its
    streams lazily during ``loss = net(x)``), one of several on the line
    (``[S() for ...]``, ``a, *b = ...``, ``d = dict(s=S())``) gets none: the
    assigned variable does not hold that stream."""
    statement = _statement_at(site)
    if statement is None:
        return ()
    names = tuple(ast.unparse(target) for target, value in _bound_pairs(statement)
                  if _named(target) and _constructs_stream(value))
    made = sum(map(_constructs_stream, ast.walk(statement)))
    return names if names and len(names) == made else ()


def _constant(node) -> bool:
    """A number the source spells as arithmetic on literals (``1 << 20``, ``-1``, ``4 * 1024``)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    return isinstance(node, ast.BinOp) and _constant(node.left) and _constant(node.right)


def _is_op(node) -> bool:
    if _constant(node):
        return False  # a number, not an op
    return isinstance(node, (ast.Call, ast.BinOp, ast.Compare, ast.UnaryOp))


def tensor_name(site) -> Optional[str]:
    """The variable that holds the storage allocated at ``site``: the
    target of its statement when that statement is one op (``y = x * 2``,
    ``w = torch.ones(8)``) called from the line itself or through at most
    one library function (``y = F.relu(x)``); else None.  An intermediate
    (``y = a * b + c``), a library's own buffer allocated inside a user
    statement (FSDP2's all-gather output inside ``loss = net(x).sum()``),
    a lambda's, a comprehension's or a container's element are not the
    assigned variable's."""
    if len(getattr(site, "library", ())) > 1:
        return None
    statement = _statement_at(site)
    pairs = _bound_pairs(statement) if statement is not None else []
    if len(pairs) != 1 or not _named(pairs[0][0]):
        return None
    target, value = pairs[0]
    if not _is_op(value) or sum(map(_is_op, ast.walk(value))) != 1:
        return None
    return ast.unparse(target)


def _code(site):
    """The code object of ``site``'s innermost user frame, or None."""
    frames = getattr(site, "frames", None)
    return frames[0][0] if frames else None


def in_scope(made_at, paste_at) -> bool:
    """Whether a name bound at ``made_at`` can be used at ``paste_at``: the
    same function, or a module-level name of the same file.  Where either
    site is unknown the name is kept."""
    made, here = _code(made_at), _code(paste_at)
    if made is None or here is None or made is here:
        return True
    return made.co_name == "<module>" and made.co_filename == here.co_filename


def where_in(site) -> str:
    """``file:line in function`` of ``site``'s innermost user frame."""
    code = _code(site)
    return f"{where(site)} in {code.co_name}" if code is not None else where(site)


_IMPORTS_PACKAGE = re.compile(r"^\s*import\s+npu_lifetime\b(?!\S*\s+as\b)", re.M)


def imports_npu_lifetime(site) -> bool:
    """Whether the file of ``site``'s innermost user frame binds the name
    ``npu_lifetime`` (``import npu_lifetime``); True where it can't be read."""
    found = _site_line(site)
    if found is None:
        return True
    source = "".join(linecache.getlines(found[0]))
    return not source or bool(_IMPORTS_PACKAGE.search(source))


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
        self._made_at: dict = {}  # stream key -> the site that assigned it (its name's scope)
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
        where_key = _site_line(site)
        index = self._per_line.get(where_key, 0)  # the line's streams in the order it makes them (a loop: again)
        self._per_line[where_key] = index + 1
        self._streams[key] = names[index % len(names)]
        self._made_at[key] = site

    def __call__(self, key) -> str:
        """A stream in prose: the backend's description and its variable."""
        text = self.backend.describe(key)
        code = self.stream_code(key) if key[1] != 0 else self._streams.get(key)  # handle 0: the text says default
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

    def stream_arg(self, key, at=None) -> str:
        """The stream as an argument in a fix to paste at the site ``at``: its
        expression where its name is in scope there, else a placeholder that
        says which stream to put there (``placeholder_note``)."""
        code = self.stream_code(key)
        if code and key in self._made_at and not in_scope(self._made_at[key], at):
            return f"<{code}>"  # named in another function: the note says which object
        return code if code else f"<{self.backend.describe(key)}>"

    def placeholder_note(self, placeholder: str) -> Optional[str]:
        """What a ``<name>`` placeholder of ``stream_arg`` stands for, when it
        is a stream named out of the paste line's scope; else None."""
        for key, code in self._streams.items():
            if placeholder == f"<{code}>" and key in self._made_at:
                return (f"({placeholder}: the stream made as `{code}` at {where_in(self._made_at[key])}; "
                        "use the name it has where you paste)")
        return None

    def is_collective(self, key) -> bool:
        return self.backend.device_type == "cpu" and key[1] < 0

    # -- tensors ------------------------------------------------------------------
    def tensor(self, alloc_site, at=None) -> tuple:
        """``(code, known)`` for a fix pasted at the site ``at``: the variable
        the tensor was assigned to at its allocation, where that name is in
        scope there; else a placeholder (not known: ``tensor_prose`` says
        what it stands for): ``<name>`` for a tensor named in another
        function, ``x`` for one never named."""
        name = tensor_name(alloc_site)
        if name and not in_scope(alloc_site, at):
            return f"<{name}>", False
        return (name, True) if name else ("x", False)

    def tensor_prose(self, alloc_site) -> str:
        name = tensor_name(alloc_site)
        if name:
            return f"the tensor allocated as `{name}` at {where_in(alloc_site)}"
        return f"the tensor allocated at {where(alloc_site)}"

    def record_stream(self, tensor: str, stream: str) -> str:
        if self.backend.device_type == "cpu":
            return f"npu_lifetime.record_stream({tensor}, {stream})"
        return f"{tensor}.record_stream({stream})"
