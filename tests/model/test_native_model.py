"""The native lifetime model (npu_lifetime/lifetime/native_model.cpp)
against the Python one it mirrors (model.py, the reference): the same
schedules and the same direct API calls fed to both must give equal
findings, in the same order, with equal ReuseOutcome state afterwards, and
equal ModelInputErrors.  A deliberately broken native model must be
caught.  The model's own suites (test_model_input.py, test_semantics_*.py,
test_schedule_threads.py) run on both classes themselves (conftest.py's
model_both_ways)."""
import os

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from npu_lifetime import lifetime
from npu_lifetime.lifetime import model as model_module
from npu_lifetime.lifetime.findings import Access, ReuseOutcome, ReuseRace, UncoveredFree
from npu_lifetime.schedules import RecordUse, Schedule, feed
from npu_lifetime.strategies import schedules

if lifetime.NativeLifetimeModel is None:
    if os.environ.get("CI") == "true":
        raise AssertionError("npu_lifetime.lifetime._native_model is not built: setup.py must build it in CI")
    pytest.skip("npu_lifetime.lifetime._native_model is not built (python setup.py build_ext --inplace)",
                allow_module_level=True)

PY = model_module.LifetimeModel
NATIVE = lifetime.NativeLifetimeModel


# -- normalising findings -----------------------------------------------------------

def norm(value, depth=0):
    """A comparable form of a finding (or list of them, or any value),
    every dataclass field included, and for an UncoveredFree its
    ReuseOutcome's state (the race in it without its free, which points back)."""
    if isinstance(value, list):
        return [norm(v, depth) for v in value]
    if isinstance(value, tuple) and not isinstance(value, Access):
        return tuple(norm(v, depth) for v in value)
    if callable(value) and not isinstance(value, type):
        return "<callable site>"  # each model's driver has its own
    if isinstance(value, Access):
        return ("Access", *(norm(v, depth) for v in value))
    if isinstance(value, ReuseOutcome):
        race = value.race
        return ("ReuseOutcome", value.reuses, norm(value.safe_reuse), value.host_synced, value.held_by_allocator,
                value.forgotten, None if race is None else _shallow(race), norm(value.sync_site))
    if hasattr(value, "__dataclass_fields__"):
        fields = []
        for name in value.__dataclass_fields__:
            field = getattr(value, name)
            if name == "outcome":
                fields.append((name, norm(field) if depth == 0 else None))
            elif name == "free":
                fields.append((name, norm(field, depth + 1)))
            else:
                fields.append((name, norm(field, depth)))
        return (type(value).__name__, *fields)
    return value


def _shallow(race: ReuseRace):
    return ("ReuseRace", norm(race.storage), race.address, norm(race.access), norm(race.alloc_site),
            norm(race.previous), norm(race.previous_use), norm(race.free, 1))


def outcomes(found: list) -> list:
    return [norm(f.outcome) for f in found if isinstance(f, UncoveredFree) and f.outcome is not None]


# -- schedules through both models -------------------------------------------------------

def run_schedule(model_class, schedule: Schedule):
    """What a model makes of ``schedule``: its retained findings, what
    ``on_finding`` saw, ``flush``'s, the outcomes after the run, and the
    host and outstanding state, or the error it raised."""
    seen = []
    m = model_class(on_finding=seen.append)
    try:
        feed(schedule, m)
    except lifetime.ModelInputError as error:
        return ("error", str(error))
    retained = list(m.findings)
    flushed = m.flush()
    return {
        "retained": norm(retained),
        "seen": norm(seen),
        "flushed": norm(flushed),
        "outcomes": outcomes(retained),
        "hosts": m.hosts(),
        "host_clock": m.host_clock(),
        "outstanding": m.outstanding_uses(),
        "findings_after_flush": norm(m.findings),
    }


def difference(schedule: Schedule, reference=PY, candidate=NATIVE):
    """None if both models agree on ``schedule``, else what differs."""
    a, b = run_schedule(reference, schedule), run_schedule(candidate, schedule)
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    return (a, b)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(max_streams=4, max_events=3, max_steps=40, misuse=True))
def test_native_model_agrees_with_python_on_schedules(schedule):
    assert difference(schedule) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules(max_streams=3, max_events=2, max_steps=40, blocks=1))
def test_native_model_agrees_on_crowded_memory_with_a_small_outstanding_cap(schedule):
    """One block of memory (reuse everywhere) and at most 2 outstanding uses
    (both models read the cap from model.py): forgotten uses and retirement."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "_OUTSTANDING_CAP", 2)
        assert difference(schedule) is None


# -- direct API calls, invalid ones included ---------------------------------------------

STREAMS = st.sampled_from([0, 1, 2, 0, 1, 2, 3, "x"])  # 3 and "x" are sometimes never created
STORAGES = st.sampled_from(["a", "b", "c", "a", "b", "c", "zz"])  # "zz": often never allocated
EVENTS = st.sampled_from([0, 1, 2])
HOSTS = st.sampled_from([None, 1, 2, "h"])
ADDRESSES = st.sampled_from([None, 0, 0, 4, 8, 16, 32])
SIZES = st.sampled_from([0, 4, 8, 16])
SITES = st.one_of(st.none(), st.integers(0, 5), st.just("callable"))

ACCESS = st.tuples(st.just("access"), STORAGES, STREAMS, st.booleans(), st.sampled_from([None, "", "op"]), SITES)
ALLOCATE = st.tuples(st.just("allocate"), STORAGES, STREAMS, ADDRESSES, SIZES, SITES, st.booleans())
# the calls that make findings, half of all calls
BUSY = st.one_of(
    ACCESS, ACCESS, ACCESS, ALLOCATE, ALLOCATE,
    st.tuples(st.just("free"), STORAGES, SITES),
    st.tuples(st.just("wait_stream"), STREAMS, STREAMS),
    st.tuples(st.just("record_use"), STORAGES, STREAMS, SITES),
)
OTHER = st.one_of(
    st.tuples(st.just("create_stream"), STREAMS, st.sampled_from([0, 1])),
    st.tuples(st.just("create_event"), EVENTS),
    st.tuples(st.just("delete_event"), EVENTS),
    st.tuples(st.just("record_event"), EVENTS, STREAMS),
    st.tuples(st.just("wait_event"), STREAMS, EVENTS, SITES),
    st.tuples(st.just("synchronize_event"), EVENTS, SITES),
    st.tuples(st.just("event_query_complete"), EVENTS, SITES),
    st.tuples(st.just("synchronize_stream"), STREAMS, SITES),
    st.tuples(st.just("synchronize_device"), st.sampled_from([None, 0, 1]), SITES),
    st.tuples(st.just("set_host"), HOSTS),
    st.tuples(st.just("fork_host"), HOSTS, st.sampled_from([None, "current", "empty", "extra"])),
    st.tuples(st.just("join_host"), HOSTS),
    st.tuples(st.just("follow_hosts"), st.lists(HOSTS, max_size=3)),
    st.tuples(st.just("end_host"), HOSTS),
    st.tuples(st.just("forget_host"), HOSTS),
    st.tuples(st.just("set_size"), STORAGES, SIZES),
    st.tuples(st.just("record_stream"), STORAGES, STREAMS, SITES),
    st.tuples(st.just("erase_stream"), STORAGES, STREAMS, SITES),
    st.tuples(st.just("uncovered_live"), st.one_of(st.none(), st.lists(STORAGES, max_size=3))),
    st.tuples(st.just("flush")),
    st.tuples(st.just("allocator_holds"), st.integers(0, 3)),
    st.tuples(st.just("query"), STORAGES, STREAMS, EVENTS, ADDRESSES),
)
CALL = st.one_of(BUSY, OTHER)


class Driver:
    """Makes the calls on one model; its callable sites count their calls."""

    def __init__(self, model_class, remember_frees):
        self.seen = []
        kwargs = {} if remember_frees is None else {"remember_frees": remember_frees}
        self.model = model_class(on_finding=self.seen.append, **kwargs)
        self.site_calls = 0
        self.frees = []  # the UncoveredFrees free() returned, for allocator_holds

    def site(self, value):
        if value != "callable":
            return value
        def capture():
            self.site_calls += 1
            return f"captured {self.site_calls}"
        return capture

    def call(self, op):
        m, name, args = self.model, op[0], op[1:]
        if name in ("wait_event", "synchronize_event", "event_query_complete", "synchronize_stream",
                    "synchronize_device", "record_stream", "erase_stream", "record_use", "free"):
            *rest, site = args
            result = getattr(m, name)(*rest, site=self.site(site))
        elif name == "access":
            storage, stream, is_write, op_name, site = args
            result = m.access(storage, stream, is_write, op=op_name, site=self.site(site), args=("self",))
        elif name == "allocate":
            storage, stream, address, size, site, preexisting = args
            result = m.allocate(storage, stream, address, size, site=self.site(site), preexisting=preexisting)
        elif name == "fork_host":
            child, clock = args
            clock = {"current": m.host_clock(), "empty": {}, "extra": {0: 7, "never": 2}, None: None}[clock]
            result = m.fork_host(child, clock)
        elif name == "allocator_holds":
            if not self.frees:
                return None
            result = m.allocator_holds(self.frees[args[0] % len(self.frees)])
        elif name == "query":
            storage, stream, event, address = args
            result = (m.is_live(storage), m.has_stream(stream), m.has_event(event), m.event_recorded(event),
                      m.storage_at(address), m.hosts(), m.host_clock(), m.outstanding_uses())
        else:
            result = getattr(m, name)(*args)
        if name == "free":
            self.frees += [f for f in result if isinstance(f, UncoveredFree)]
        return result

    def step(self, op):
        try:
            return ("ok", norm(self.call(op)))
        except lifetime.ModelInputError as error:
            return ("ModelInputError", str(error))


def run_calls(model_class, calls, remember_frees, setup=True):
    d = Driver(model_class, remember_frees)
    if setup:
        for s in (0, 1, 2):
            d.model.create_stream(s, device=s % 2)
        d.model.create_event(0)
        d.model.allocate("a", 0, address=0, size=16, site="setup a")
        d.model.allocate("b", 1, address=16, size=8, site="setup b")
    results = [d.step(op) for op in calls]
    return {
        "results": results,
        "seen": norm(d.seen),
        "retained": norm(d.model.findings),
        "outcomes": outcomes(d.frees),
        "site_calls": d.site_calls,
        "end": norm(d.model.flush()),
    }


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CALL, min_size=10, max_size=80), st.sampled_from([None, 0, 1, 2]), st.sampled_from([None, 1, 3]))
def test_native_model_agrees_on_direct_api_calls(calls, remember_frees, cap):
    with pytest.MonkeyPatch.context() as mp:
        if cap is not None:
            mp.setattr(model_module, "_OUTSTANDING_CAP", cap)
        expected = run_calls(PY, calls, remember_frees)
        got = run_calls(NATIVE, calls, remember_frees)
    assert got == expected


def _random_call(rng):
    """One call of the same kinds as CALL, drawn with ``random`` (many
    sequences cheaply; weighted towards allocations, accesses and frees)."""
    stream = rng.choice([0, 1, 2, 0, 1, 2, 3, "x"])
    storage = rng.choice("abcabcd") if rng.random() < 0.97 else "zz"
    site = rng.choice([None, rng.randrange(6), "callable"])
    kind = rng.choices(
        ["access", "allocate", "free", "wait_stream", "record_use", "record_stream", "erase_stream",
         "record_event", "wait_event", "synchronize_event", "synchronize_stream", "synchronize_device", "set_host",
         "fork_host", "join_host", "follow_hosts", "end_host", "forget_host", "set_size", "uncovered_live",
         "allocator_holds", "create_event", "delete_event", "create_stream", "flush", "query"],
        [30, 10, 8, 8, 4, 3, 2, 3, 3, 2, 3, 2, 3, 2, 2, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1])[0]
    host = rng.choice([None, 1, 2, "h"])
    event = rng.randrange(3)
    address = rng.choice([None, 0, 8, 16, 24, 32])
    size = rng.choice([0, 8, 16, 16])
    return {
        "access": ("access", storage, stream, rng.random() < 0.5, rng.choice([None, "", "op"]), site),
        "allocate": ("allocate", storage, stream, address, size, site, rng.random() < 0.1),
        "free": ("free", storage, site),
        "wait_stream": ("wait_stream", stream, rng.choice([0, 1, 2])),
        "record_use": ("record_use", storage, stream, site),
        "record_stream": ("record_stream", storage, stream, site),
        "erase_stream": ("erase_stream", storage, stream, site),
        "record_event": ("record_event", event, stream),
        "wait_event": ("wait_event", stream, event, site),
        "synchronize_event": (rng.choice(["synchronize_event", "event_query_complete"]), event, site),
        "synchronize_stream": ("synchronize_stream", stream, site),
        "synchronize_device": ("synchronize_device", rng.choice([None, 0, 1]), site),
        "set_host": ("set_host", host),
        "fork_host": ("fork_host", host, rng.choice([None, "current", "empty", "extra"])),
        "join_host": ("join_host", host),
        "follow_hosts": ("follow_hosts", [rng.choice([None, 1, 2, "h"]) for _ in range(rng.randrange(3))]),
        "end_host": ("end_host", host),
        "forget_host": ("forget_host", host),
        "set_size": ("set_size", storage, size),
        "uncovered_live": ("uncovered_live", rng.choice([None, ["a", "b"], ["zz", "c"]])),
        "allocator_holds": ("allocator_holds", rng.randrange(4)),
        "create_event": ("create_event", event),
        "delete_event": ("delete_event", event),
        "create_stream": ("create_stream", stream, rng.randrange(2)),
        "flush": ("flush",),
        "query": ("query", storage, stream, event, address),
    }[kind]


@pytest.mark.parametrize("seed", range(4))
def test_native_model_agrees_on_random_call_sequences(seed, monkeypatch):
    import random

    rng = random.Random(seed)
    if seed % 2:
        monkeypatch.setattr(model_module, "_OUTSTANDING_CAP", 3)
    for _ in range(400):
        calls = [_random_call(rng) for _ in range(rng.randrange(20, 120))]
        remember_frees = rng.choice([None, 0, 1, 4])
        expected = run_calls(PY, calls, remember_frees)
        assert run_calls(NATIVE, calls, remember_frees) == expected, calls


def test_the_direct_calls_reach_reuse_races_and_every_outcome():
    """The API-call comparison is not vacuous: a hand-made sequence through
    both models gives a reuse race, a safe reuse, a host sync, a hold and a
    forgotten use, equal in both."""
    calls = [
        ("allocate", "c", 0, 32, 16, 1, False), ("wait_stream", 1, 0), ("access", "c", 1, False, "op", 2),
        ("free", "c", "callable"),  # uncovered: the read on 1
        ("allocate", "d", 0, 32, 16, 3, False), ("access", "d", 0, True, None, 4),  # a reuse race
        ("allocate", "e", 0, 64, 16, 5, False), ("wait_stream", 1, 0), ("access", "e", 1, True, None, 6),
        ("free", "e", 7),
        ("allocate", "f", 0, 64, 16, 8, False), ("wait_stream", 0, 1), ("access", "f", 0, True, None, 9),  # safe
        ("allocate", "g", 2, 96, 8, 10, False), ("wait_stream", 1, 2), ("access", "g", 1, True, None, 11),
        ("free", "g", 12), ("synchronize_stream", 1, "callable"),  # host synced
        ("allocate", "h", 0, 128, 8, 13, False), ("wait_stream", 2, 0), ("access", "h", 2, True, None, 14),
        ("free", "h", 15), ("allocator_holds", 3),  # held
        ("query", "a", 0, 0, 0),
    ]
    expected = run_calls(PY, calls, None)
    assert run_calls(NATIVE, calls, None) == expected
    kinds = [f[0] for r in expected["results"] if r[0] == "ok" and isinstance(r[1], list) for f in r[1]]
    assert "ReuseRace" in kinds and "UncoveredFree" in kinds
    states = expected["outcomes"]
    assert any(o[-2] is not None for o in states)  # a race
    assert any(o[2] is not None for o in states)  # a safe reuse
    assert any(o[3] for o in states)  # host synced
    assert any(o[4] for o in states)  # held by the allocator


@pytest.mark.parametrize("calls", [
    # the host waited past the write on 1, not past the read after it: the
    # free leaves only the read outstanding, so the new owner's read is no
    # safe reuse (nothing to be ordered after)
    [("allocate", "c", 0, 32, 16, 1, False), ("wait_stream", 1, 0), ("access", "c", 1, True, None, 2),
     ("record_event", 0, 1), ("access", "c", 1, False, None, 3), ("synchronize_event", 0, 4), ("free", "c", 5),
     ("allocate", "d", 0, 32, 16, 6, False), ("access", "d", 0, False, None, 7),
     ("access", "d", 0, True, None, 8)],
    # a thread that starts with an empty clock after the main one synchronised
    [("allocate", "c", 0, 32, 16, 1, False), ("wait_stream", 1, 0), ("access", "c", 1, True, None, 2),
     ("synchronize_stream", 1, 3), ("access", "c", 1, False, None, 4), ("free", "c", 5),
     ("set_host", "h"), ("allocate", "d", 0, 32, 16, 6, False), ("access", "d", 0, False, None, 7),
     ("set_host", None), ("end_host", "h"), ("synchronize_device", None, "callable")],
])
def test_hand_made_call_sequences_agree(calls):
    expected = run_calls(PY, calls, None)
    assert run_calls(NATIVE, calls, None) == expected


def test_input_errors_carry_the_same_messages():
    for model_class in (PY, NATIVE):
        m = model_class()
        m.create_stream("A")
        m.allocate("x", "A", address=0x40)
        with pytest.raises(lifetime.ModelInputError, match=r"unknown stream 'B'; call create_stream first"):
            m.read("x", "B")
        with pytest.raises(lifetime.ModelInputError, match=r"unknown event 'e'; call create_event first"):
            m.record_event("e", "A")
        with pytest.raises(lifetime.ModelInputError, match=r"unknown storage 'y'"):
            m.read("y", "A")
        with pytest.raises(lifetime.ModelInputError, match=r"storage 'x' allocated while live"):
            m.allocate("x", "A")
        with pytest.raises(lifetime.ModelInputError, match=r"address 0x40 allocated while storage 'x' is live there"):
            m.allocate("z", "A", address=0x40)
        with pytest.raises(TypeError):
            m.read(["unhashable"], "A")


def test_bounds_are_read_from_model_py(monkeypatch):
    """The outstanding cap is model.py's _OUTSTANDING_CAP at each call (a test
    can shrink it); remember_frees defaults to model.py's _FREED_MEMORY."""
    monkeypatch.setattr(model_module, "_OUTSTANDING_CAP", 1)
    for model_class in (PY, NATIVE):
        m = model_class()
        m.create_stream(0)
        m.create_stream(1)
        frees = []
        for i, storage in enumerate("ab"):
            m.allocate(storage, 0, address=16 * i, size=16)
            m.wait_stream(1, 0)
            m.read(storage, 1)
            frees += m.free(storage)
        assert m.outstanding_uses() == 1
        assert [f.outcome.forgotten for f in frees] == [True, False]
    m = NATIVE(remember_frees=1)
    m.create_stream(0)
    for storage in "ab":
        m.allocate(storage, 0)
        m.free(storage)
    assert [f.reason for f in m.free("a") + m.free("b")] == ["unknown", "double"]


def test_a_model_subclass_and_attributes_work_as_in_python():
    class Sub(NATIVE):
        pass

    m = Sub(retain=False)
    m.note = "kept"
    m.create_stream(0)
    m.allocate("x", 0)
    m.free("x")
    assert m.free("x")[0].reason == "double" and m.findings == [] and m.note == "kept"
    m.retain = True
    m.findings = []
    m.free("x")
    assert len(m.findings) == 1


# -- the comparison can fail -----------------------------------------------------------------

class _DropsRecordUse:
    """A broken native model: record_use does nothing."""

    def __init__(self, *args, **kwargs):
        self._inner = NATIVE(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def record_use(self, storage, stream, site=None):
        return []


def test_the_comparison_catches_a_native_model_that_drops_record_use():
    found = find(
        schedules(max_streams=3, max_events=2, max_steps=30),
        lambda s: difference(s, PY, _DropsRecordUse) is not None,
        settings=settings(database=None, derandomize=True, max_examples=3000, deadline=None),
    )
    assert any(isinstance(step, RecordUse) for step in found.steps), found
    assert difference(found, PY, NATIVE) is None  # the real native model agrees on it


# -- the fuzzer's --model native ------------------------------------------------------------

def test_fuzz_runs_the_native_model_against_the_oracle():
    from npu_lifetime.schedules.fuzz import FuzzConfig, fuzz

    result = fuzz(FuzzConfig(schedules=300, jobs=1, model="native"))
    assert result.failure is None and result.checked == 300
    with pytest.raises(ValueError, match="model must be one of"):
        FuzzConfig(model="rust")


def test_fuzz_with_the_native_model_catches_a_broken_one_and_its_reproducer_names_it(monkeypatch):
    from npu_lifetime.schedules.fuzz import FuzzConfig, fuzz

    monkeypatch.setattr(lifetime, "NativeLifetimeModel", _DropsRecordUse)
    result = fuzz(FuzzConfig(schedules=5000, jobs=1, model="native"))
    assert result.failure is not None
    assert result.failure.check == "compare(schedule, 'native')"
    assert any(isinstance(step, RecordUse) for step in result.failure.schedule.steps)
    assert fuzz(FuzzConfig(schedules=300, jobs=1, model="python")).failure is None
