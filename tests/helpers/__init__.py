"""Shared test helpers (no tests here): imported as ``helpers.NAME``."""
