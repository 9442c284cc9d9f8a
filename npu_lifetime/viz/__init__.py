"""Pictures of block lifetimes: the shim's allocator trace turned into
block lives (``lives``), a pickle for PyTorch's memory viewer
(``memory_viz``) and a self-contained HTML timeline (``timeline``).
``recorder`` captures what they need while a script runs; ``demo`` is a
built-in hand-off on the simulated runtime."""
