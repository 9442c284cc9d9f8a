"""Comparing two runs' findings: leave out what depends on the host's
allocator.  A reuse race is reported where the allocator really handed a
freed storage's memory to another tensor, which two runs of one program
(one after the other, in one process) may not both see: seen on the GPU
host, a reuse race in the first run only, the uncovered free behind it in
both.  The uncovered free is the contract's verdict and stays compared."""


def not_by_chance(findings: list) -> list:
    """``findings`` as text (``reuse_race ...`` lines or ``ReuseRace(...)``
    reprs) without the reuse races."""
    return [line for line in findings if not line.startswith(("reuse_race", "ReuseRace("))]
