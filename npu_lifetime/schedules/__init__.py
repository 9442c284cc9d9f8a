"""Simulated stream schedules: the language, a runner that feeds them to the
lifetime model, an independent oracle, a simulated executor, and hypothesis
strategies that generate them."""
from .compare import Comparison, compare
from .executor import Execution, delay_stream, execute, random_order
from .oracle import run_oracle
from .runner import feed, finding_key, run_model
from .schedule import (
    Alloc,
    EraseStream,
    Free,
    QueryEvent,
    Read,
    RecordEvent,
    RecordStream,
    RecordUse,
    Schedule,
    ScheduleError,
    SyncDevice,
    SyncEvent,
    SyncStream,
    View,
    WaitEvent,
    WaitStream,
    Write,
)

__all__ = [
    "Alloc", "Comparison", "EraseStream", "Execution", "Free", "QueryEvent", "Read",
    "RecordEvent", "RecordStream", "RecordUse", "Schedule", "ScheduleError", "SyncDevice",
    "SyncEvent", "SyncStream", "View", "WaitEvent", "WaitStream", "Write", "compare",
    "delay_stream", "execute", "feed", "finding_key", "random_order", "run_model", "run_oracle",
]
