"""npu_lifetime: allocator-level cross-stream lifetime checking for PyTorch."""
__version__ = "0.1.0"
