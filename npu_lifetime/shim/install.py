"""Installs the shim as the process allocator of ``cuda`` or ``npu`` through
the framework's pluggable-allocator API, and routes ``Tensor.record_stream``
to it (a pluggable allocator otherwise accepts the call and drops it)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

from . import api
from .native import library_path

_DEVICES = {
    # device: (runtime, dispatch key of the device's tensors)
    "cuda": ("cuda", "CUDA"),
    "npu": ("acl", "PrivateUse1"),
}


class InstallError(RuntimeError):
    pass


@dataclass(frozen=True)
class Installed:
    device: str
    runtime: str
    policy: str
    library: str


_installed: Optional[Installed] = None
_record_stream_library = None  # keeps the aten::record_stream override registered


def installed() -> Optional[Installed]:
    """What ``install`` set up in this process, if anything."""
    return _installed


def install(device: str = "cuda", policy: str = "poll") -> Installed:
    """Makes the shim the allocator of ``device`` ("cuda" or "npu").

    Must run before the device allocates anything: the frameworks refuse to
    swap an allocator once it has been used.  ``policy`` is "poll" (a freed
    block waiting on events is reused once they fired) or "stream_wait" (it
    is reused at once, the allocating stream waiting on the events).
    """
    global _installed
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {sorted(_DEVICES)}, not {device!r}")
    if _installed is not None:
        if _installed.device == device:
            api.set_policy(policy)
            _installed = Installed(device, _installed.runtime, policy, _installed.library)
            return _installed
        raise InstallError(f"the shim is already installed for {_installed.device}")
    runtime, dispatch_key = _DEVICES[device]
    api.select_runtime(runtime)
    api.set_policy(policy)
    path = str(library_path())
    memory = _device_memory_module(device)
    allocator_class = memory.CUDAPluggableAllocator if device == "cuda" else memory.NPUPluggableAllocator
    try:
        memory.change_current_allocator(allocator_class(path, "npl_alloc", "npl_free"))
    except RuntimeError as err:
        raise InstallError(
            f"cannot install the shim for {device}: the {device} allocator was already used "
            f"in this process ({err}). Call npu_lifetime.install() before any {device} tensor, "
            "stream or memory call."
        ) from err
    _route_record_stream(device, dispatch_key)
    _installed = Installed(device, runtime, policy, path)
    return _installed


def _device_memory_module(device: str):
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InstallError("install('cuda') needs a CUDA device; none is available")
        return torch.cuda.memory
    try:
        import torch_npu
    except ImportError as err:
        raise InstallError("install('npu') needs torch_npu, which is not installed") from err
    return torch_npu.npu.memory


def device_stream(device: str, stream) -> object:
    """The device module's Stream for a generic ``torch.Stream``."""
    if device == "cuda":
        import torch

        return torch.cuda.Stream(
            stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
        )
    import torch_npu

    return torch_npu.npu.Stream(
        stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
    )


def stream_handle(stream) -> int:
    """The runtime handle of a torch.cuda / torch_npu stream."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        handle = stream.npu_stream
    return int(handle)


def _route_record_stream(device: str, dispatch_key: str) -> None:
    import torch

    global _record_stream_library

    def record_stream(tensor, stream):
        handle = stream_handle(device_stream(device, stream))
        api.record_stream(tensor.untyped_storage().data_ptr(), handle)

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        lib.impl("record_stream", record_stream, dispatch_key)
    _record_stream_library = lib
