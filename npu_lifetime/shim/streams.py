"""The device module's typed streams (torch.cuda's, torch_npu's) for the
generic ``torch.Stream`` that torch hands around."""
from __future__ import annotations


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
