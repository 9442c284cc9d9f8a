"""Stand-in for psutil, put on PYTHONPATH by run_suites.py only when the
Python that runs the suites cannot import the real one (torch does not
depend on it; test_cuda.py imports it at module level but uses it only in
TestGDS, a class outside the selection and skipped upstream).  Without it
the whole module would fail to collect under both allocators."""
import collections

STUB = True

_Partition = collections.namedtuple("sdiskpart", "device mountpoint fstype opts")


def disk_partitions(all=False):  # noqa: A002 - psutil's signature
    return [_Partition("stub", "/", "unknown", "")]
