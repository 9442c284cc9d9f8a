"""FSDP-style stream hand-offs: the hand-rolled recipe, its record_use
migration, and a harness that runs them (and their classic mistakes) on the
simulated device or a real device's streams (CUDA, NPU)."""
from .devices import CudaHandoffDevice, NpuHandoffDevice, SimHandoffDevice, TorchHandoffDevice
from .harness import HarnessResult, run_handoff
from .recipes import (
    BROKEN,
    CORRECT,
    BrokenDropOutsideOwnerStream,
    BrokenEventTooLate,
    BrokenRecordUseBeforeLastRead,
    BrokenStashDroppedEarly,
    EventStash,
    Handoff,
    RecipeHandoff,
    RecordStreamHandoff,
    RecordUseHandoff,
)

__all__ = [
    "BROKEN", "CORRECT", "BrokenDropOutsideOwnerStream", "BrokenEventTooLate", "BrokenRecordUseBeforeLastRead",
    "BrokenStashDroppedEarly", "CudaHandoffDevice", "EventStash", "Handoff", "HarnessResult", "NpuHandoffDevice",
    "RecipeHandoff", "RecordStreamHandoff", "RecordUseHandoff", "SimHandoffDevice", "TorchHandoffDevice", "run_handoff",
]
