"""Reports a user can paste (issue 17, part 4): fixes that run on the device
in question, with the program's own names for tensors and streams; latent
reasons and free sites that are true; groups that say how many storages
they hold."""
import json
import textwrap
import types

import pytest
from npu_lifetime.cli import main
from npu_lifetime.sanitizer.user_names import Names, stream_names
from helpers.pasted_fixes import suggested_fixes
from helpers.scripts import forgotten_handoff, write_script

pytestmark = pytest.mark.usefixtures("both_ways")  # conftest.py: C parts, then Python's



def check(tmp_path, path, capsys, *options):
    out = tmp_path / "r.json"
    code = main(["check", "--device", "sim", "--json", str(out), *options, path])
    text = capsys.readouterr().out
    return code, text, json.loads(out.read_text())["findings"]


def test_each_suggested_fix_pasted_into_the_program_makes_it_pass(tmp_path, capsys):
    code, text, [finding] = check(tmp_path, write_script(tmp_path, forgotten_handoff(tensor="weights", result="doubled")), capsys)
    assert code == 1
    # the program's own names, and calls that run on the simulated device
    assert "`weights` (storage" in text and "sim stream" in text and "(`side`)" in text
    fixes = suggested_fixes(text)
    assert fixes == ["npu_lifetime.record_use(weights, side)", "npu_lifetime.record_stream(weights, side)",
                     "npu_lifetime.simdevice.default_stream().wait_stream(side)"], text
    assert "x.record_stream" not in text and "<sim" not in text  # no placeholder, no call that crashes here
    assert "npu_lifetime.record_use(weights, side)" in finding["fix"]
    for fix in fixes:
        fixed = write_script(tmp_path, forgotten_handoff(fix, tensor="weights", result="doubled"), "fixed.py")
        code, text, _ = check(tmp_path, fixed, capsys)
        assert code == 0, (fix, text)


def test_a_data_race_fix_names_both_streams_and_runs(tmp_path, capsys):
    body = """
        import torch
        import npu_lifetime
        from npu_lifetime import simdevice as sd

        producer = sd.Stream()
        buffer = torch.zeros(16)
        producer.wait_stream(sd.default_stream())
        with sd.stream(producer):
            buffer.fill_(3.0)
        {fix}
        total = buffer.sum()
        npu_lifetime.record_use(buffer, producer)
    """
    code, text, [race] = check(tmp_path, write_script(tmp_path, body.format(fix="")), capsys)
    assert code == 1 and race["kind"] == "data_race"
    [fix] = suggested_fixes(text)
    assert fix == "npu_lifetime.simdevice.default_stream().wait_stream(producer)", text
    code, text, _ = check(tmp_path, write_script(tmp_path, body.format(fix=fix), "fixed.py"), capsys)
    assert code == 0, text


def test_an_unknown_tensor_name_is_not_guessed(tmp_path, capsys):
    body = """
        import torch
        from npu_lifetime import simdevice as sd

        side = sd.Stream()
        def use(t):
            with sd.stream(side):
                t.sum()
        side.wait_stream(sd.default_stream())
        use(torch.ones(8))  # no variable names this tensor
    """
    code, text, _ = check(tmp_path, write_script(tmp_path, body), capsys)
    assert code == 1
    assert "(x: the tensor allocated at prog.py:10)" in text, text


def test_the_latent_reason_names_the_host_wait_that_made_it_latent(tmp_path, capsys):
    body = forgotten_handoff(size=8) + textwrap.dedent("""
        with sd.stream(side):
            print(y.sum().item())  # the script's only host wait, at its end (line 15)
    """)
    code, text, [free] = check(tmp_path, write_script(tmp_path, body), capsys)
    assert code == 1
    [reason] = free["latent_reasons"]
    assert "not reused before the host waited past the use at" in reason["reason"]
    assert "prog.py:15" in reason["reason"], reason  # that wait, not a vague "the host synchronised"


def test_a_free_by_the_garbage_collector_at_the_end_says_so(tmp_path, capsys):
    body = """
        import torch
        from npu_lifetime import simdevice as sd

        side = sd.Stream()
        def leak():
            x = torch.ones(8)
            side.wait_stream(sd.default_stream())
            with sd.stream(side):
                x.sum()
            cycle = [x]
            cycle.append(cycle)  # only the garbage collector frees x
        leak()
    """
    code, text, [free] = check(tmp_path, write_script(tmp_path, body), capsys)
    assert code == 1
    assert "autograd" not in text and "called from C++" not in text
    assert "after the script ended (the garbage collector ran before the report)" in text, text


def test_a_group_of_races_over_several_storages_counts_and_names_them(tmp_path, capsys):
    body = """
        import torch
        import npu_lifetime
        from npu_lifetime import simdevice as sd

        side = sd.Stream()
        keep = []
        for i in range(10):
            chunk = torch.ones(8)
            with sd.stream(side):
                chunk.add_(1)  # races with the allocation on the default stream
            npu_lifetime.record_use(chunk, side)
            keep.append(chunk)
    """
    code, text, [race] = check(tmp_path, write_script(tmp_path, body), capsys)
    assert code == 1 and race["count"] == 10 and race["distinct_storages"] == 10
    assert "on 10 distinct storages: `chunk` (storage" in text and "and 6 more" in text, text


LIBRARY_STREAM = """
    import torch
    import npu_lifetime
    from npu_lifetime import simdevice as sd

    {make}
    weights = torch.ones(32)
    side.wait_stream(sd.default_stream())
    with sd.stream(side):
        doubled = weights * 2
    del weights
"""


def test_a_stream_made_inside_a_call_is_not_named_after_what_the_call_returns(tmp_path, capsys):
    # FSDP2 creates its streams lazily inside the first forward: the stream
    # was named `loss` after `loss = net(x)...`, and the fix read
    # `loss.wait_stream(...)`.  Here the statement builds a dict.
    make = 'holder = dict(side=sd.Stream())\n    side = holder["side"]'
    code, text, _ = check(tmp_path, write_script(tmp_path, LIBRARY_STREAM.format(make=make)), capsys)
    assert code == 1
    assert "holder" not in text, text
    assert "<sim stream" in text and "(<...>: that stream object" in text, text


def test_streams_a_statement_constructs_are_named_in_order(tmp_path, capsys):
    make = "other, side = sd.Stream(), sd.Stream()"
    code, text, _ = check(tmp_path, write_script(tmp_path, LIBRARY_STREAM.format(make=make)), capsys)
    assert code == 1 and "(`side`)" in text and "npu_lifetime.record_use(weights, side)" in text, text


def _site_in(tmp_path, source: str, line: int = 1, library=()):
    """A site at LINE of a file holding SOURCE."""
    path = tmp_path / f"prog{len(list(tmp_path.iterdir()))}.py"
    path.write_text(textwrap.dedent(source))
    return types.SimpleNamespace(user_frames=lambda: [(str(path), line, "f")], library=library)


def test_stream_names_only_for_constructor_calls(tmp_path):
    def names(source, line=1):
        return stream_names(_site_in(tmp_path, source, line))

    assert names("side = torch.cuda.Stream(priority=-1)") == ("side",)
    assert names("s: torch.cuda.Stream = torch.cuda.Stream()") == ("s",)
    assert names("self.side = torch.cuda.ExternalStream(ptr)") == ("self.side",)
    assert names("with torch.cuda.Stream() as s:  # a comment\n    pass") == ("s",)
    assert names("a, b = torch.Stream('cuda'), torch.cuda.Stream()") == ("a", "b")
    assert names("loss = net(x).pow(2).mean()") == ()
    assert names("streams = [torch.cuda.Stream() for _ in range(3)]") == ()
    assert names("with torch.cuda.stream(torch.cuda.Stream()) as ctx:\n    pass") == ()  # ctx: a context
    # found by review: each gave a stream a name that held another
    assert names("other = sd.Stream(); side = sd.Stream()") == ()  # two statements on one line
    assert names("a, *b = S(), S()") == ()
    assert names("a, b = S(), make()") == ()
    assert names("d = dict(\n    side=sd.Stream()\n)", line=2) == ()  # a line inside a call over several lines
    assert names("side = torch.cuda.Stream(\n    priority=-1)", line=1) == ()  # a statement over several lines


def test_a_one_op_statement_names_its_tensor(tmp_path):
    names = Names(backend=None)

    def tensor(source, library=()):
        return names.tensor(_site_in(tmp_path, source, library=library))

    assert tensor("y = x * 2") == ("y", True)
    assert tensor("w = torch.full((2,), -1.0, device=dev)") == ("w", True)
    assert tensor("y = F.relu(x)", library=[("functional.py", 1)]) == ("y", True)
    assert tensor("y = a * b + c") == ("x", False)  # a * b is an intermediate
    assert tensor("loss = net(x).pow(2).mean()") == ("x", False)
    assert tensor("out = net(x)", library=[("a.py", 1), ("b.py", 2)]) == ("x", False)  # a library's buffer
    assert tensor("a, b = x.chunk(2)") == ("x", False)
    # found by review: none of these variables holds the tensor
    assert tensor("make = lambda: torch.ones(32)") == ("x", False)
    assert tensor("ys = [x * 2 for x in xs]") == ("x", False)
    assert tensor("y = [x * 2]") == ("x", False)
    assert tensor("d = {'a': x * 2}") == ("x", False)
    assert tensor("y = x * 2; z = y + 1") == ("x", False)



def test_storages_at_one_address_in_turn_are_named_once_with_their_count():
    # FSDP2's report listed "on 3 distinct storages: storage 0x4a26e40c00 ...;
    # storage 0x4a26e40c00 ...; storage 0x4a26e40c00 ..." (the allocator
    # handing one block out again)
    from npu_lifetime.sanitizer.report import _storages
    from npu_lifetime.sanitizer.finding_policy import GroupInfo

    def finding(address):
        return types.SimpleNamespace(address=address, alloc_site=None)

    sample = (finding(0xA00), finding(0xB00), finding(0xA00), finding(0xA00))
    [line] = _storages(GroupInfo(count=9, actual=False, reasons=(), storages=sample, distinct=6),
                       lambda key: str(key), lambda f: f.alloc_site)
    assert line == ("  on 6 distinct storages: storage 0xa00 allocated at <no stack> (3 storages in turn at this "
                    "address); storage 0xb00 allocated at <no stack>; and 2 more"), line


def test_an_intermediate_is_not_named_after_the_statements_result(tmp_path, capsys):
    # FSDP2's all-gather buffer, allocated inside `loss = net(x).pow(2).mean()`,
    # was reported as `loss` and the fix read `npu_lifetime.record_use(loss, ...)`.
    # Here `weights * 2` is an intermediate of the line that assigns `total`.
    body = """
        import torch
        from npu_lifetime import simdevice as sd

        side = sd.Stream()
        def on_side(t):
            side.wait_stream(sd.default_stream())
            with sd.stream(side):
                return t.sum()
        weights = torch.ones(32)
        total = on_side(weights * 2)
    """
    code, text, _ = check(tmp_path, write_script(tmp_path, body), capsys)
    assert code == 1
    assert "total" not in text and "(x: the tensor allocated at prog.py:11)" in text, text
    assert "npu_lifetime.record_use(x, side)" in text, text



def test_the_stream_constructor_wrap_tells_of_made_streams_only():
    """The CUDA and NPU backends wrap the Python Stream class's constructor
    (their creation traces fire for a whole pool at once): a call that makes
    a stream tells the sinks which one, a wrap of an existing stream
    (``stream_id=``, as ``current_stream()`` makes) tells nothing; subclasses
    go through it too."""
    from npu_lifetime.sanitizer.backends import CudaBackend

    class FakeStream:
        def __new__(cls, device=None, priority=0, **kwargs):
            stream = object.__new__(cls)
            stream.key = (0, kwargs.get("stream_id", 100 + priority))
            return stream

    class External(FakeStream):
        def __new__(cls, ptr, **kwargs):
            return super().__new__(cls, priority=ptr, **kwargs)

    heard = []

    class Sink:
        def on_stream_constructed(self, key):
            heard.append(key)

    backend = CudaBackend()
    backend.stream_key = lambda stream: stream.key
    backend._patch_stream_constructor(FakeStream)
    FakeStream(priority=1)  # no sink yet: nothing
    backend.hub.add(Sink())
    made = FakeStream(priority=2)
    FakeStream(stream_id=7, device_index=0, device_type=1)
    External(5)
    assert heard == [(0, 102), (0, 105)] and isinstance(made, FakeStream)
