"""Simulated stream schedules: the language, a runner that feeds them to the
lifetime model, an independent oracle, a simulated executor, and hypothesis
strategies that generate them."""
from .compare import Comparison, compare
from .executor import Execution, delay_stream, execute, random_order
from .oracle import run_oracle
from .properties import executor_violation, oracle_disagreement
from .runner import feed, finding_key, run_model
from .schedule import (
    Adopt,
    Alloc,
    DeleteEvent,
    EraseStream,
    Free,
    Join,
    Op,
    QueryEvent,
    Read,
    RecordEvent,
    RecordStream,
    RecordUse,
    Schedule,
    ScheduleError,
    Spawn,
    Switch,
    SyncDevice,
    SyncEvent,
    SyncStream,
    View,
    WaitEvent,
    WaitStream,
    Write,
)

__all__ = [
    "Adopt", "Alloc", "Comparison", "DeleteEvent", "Op", "EraseStream", "Execution", "Free", "Join", "QueryEvent",
    "Read", "RecordEvent", "RecordStream", "RecordUse", "Schedule", "ScheduleError", "Spawn", "Switch", "SyncDevice",
    "SyncEvent", "SyncStream", "View", "WaitEvent", "WaitStream", "Write", "compare",
    "delay_stream", "execute", "executor_violation", "oracle_disagreement", "feed", "finding_key", "random_order",
    "run_model", "run_oracle",
]
