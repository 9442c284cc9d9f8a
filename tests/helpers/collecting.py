"""The sanitizer most tests watch a program with: one that collects what it
finds (no raise, no warning at a free), and the kinds of what it found."""
from npu_lifetime.sanitizer import LifetimeSanitizer


def sanitizer(device="sim", **options) -> LifetimeSanitizer:
    """A collecting sanitizer for DEVICE (a name, or a stream_devices class)."""
    return LifetimeSanitizer(getattr(device, "name", device), on_race="collect", warn_on_free=False, **options)


def kinds(findings) -> list:
    """The findings' kinds, sorted, one per finding."""
    return sorted(f.kind for f in findings)


def distinct_kinds(findings) -> list:
    """The findings' kinds, sorted, each once."""
    return sorted({f.kind for f in findings})
