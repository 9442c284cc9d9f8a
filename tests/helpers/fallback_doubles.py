"""What the torch-allocator fallback's device-API test doubles share
(test_torch_allocator_fallback.py's FakeAPI, test_torch_allocator_fallback_cudart.py's
RawAPI): a stream is its ``handle`` and ``device_index``; the calling
thread's capture state is ``capturing``; record_stream calls, out-of-memory
observers and the allocator's segments are kept for the test to read; and
the drill both files run: threads recording at once."""
import threading


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


def record_from_threads(fallback, tensors, streams, after_call=lambda i: None, threads: int = 4,
                        calls: int = 300) -> list:
    """THREADS threads each make CALLS ``fallback.record`` calls, each over
    its own walk of TENSORS and STREAMS (AFTER_CALL(i) after its i-th);
    the exceptions they raised."""
    errors = []

    def work(seed: int) -> None:
        try:
            for i in range(calls):
                fallback.record(tensors[(seed + i) % len(tensors)], streams[(seed * 7 + i) % len(streams)])
                after_call(i)
        except BaseException as err:  # noqa: BLE001 - returned to the test
            errors.append(err)

    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors
