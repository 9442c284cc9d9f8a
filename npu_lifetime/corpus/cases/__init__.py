"""The corpus's cases, one module each (see ../case.py)."""
