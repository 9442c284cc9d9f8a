"""What the torch-allocator fallback's device-API test doubles share
(test_torch_allocator_fallback.py's FakeAPI, test_torch_allocator_fallback_cudart.py's
RawAPI): a stream is its ``handle`` and ``device_index``; the calling
thread's capture state is ``capturing``; record_stream calls, out-of-memory
observers and the allocator's segments are kept for the test to read."""


class DeviceAPIDouble:
    def __init__(self) -> None:
        self.capturing = False  # the calling thread's current stream captures
        self.recorded_streams = []  # (tensor storage address, stream handle) passed to record_stream
        self.segment_list = []
        self.version = (0, 0)
        self.oom_observers = []

    @staticmethod
    def handle(stream) -> int:
        return stream.handle

    @staticmethod
    def device_index(stream) -> int:
        return stream.device_index

    def is_capturing(self) -> bool:
        return self.capturing

    def record_stream(self, tensor, stream) -> None:
        self.recorded_streams.append((tensor.untyped_storage().data_ptr(), stream.handle))

    def attach_oom_observer(self, observer) -> None:
        self.oom_observers.append(observer)

    def segments(self) -> list:
        return self.segment_list

    def segment_version(self, device: int):
        return self.version
