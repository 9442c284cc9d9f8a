"""The built native allocator shim (libnpl*.so) lands here."""
