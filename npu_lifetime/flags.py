"""Booleans are booleans: in the API, the pytest marker and the environment.

A switch given anything but True or False (``allow_latent="no"``, which is
truthy) is refused with one message instead of silently turning checking
off; an environment switch takes 1/0, true/false, yes/no, on/off (any case)
and refuses anything else.
"""
from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def flag(value, name: str) -> bool:
    """``value`` when it is True or False; TypeError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__} {value!r}")
    return value


def env_flag(variable: str) -> bool:
    """The environment switch ``variable`` (unset: False); ValueError for a value that is no switch."""
    value = os.environ.get(variable, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{variable} must be 1 or 0 (true/false, yes/no, on/off), not {os.environ[variable]!r}")


def env_choice(variable: str) -> str:
    """A variable that is a switch or a choice (``NPU_LIFETIME_SANITIZER=sim``):
    its value, lower-cased, or ``""`` when unset or switched off (0/false/no/off)."""
    value = os.environ.get(variable, "").strip().lower()
    return "" if value in _FALSE else value


def env_mode(variable: str, choices: tuple, default: str, on: str, off: str) -> str:
    """A variable that is a switch or one of ``choices``: ``default`` when unset
    or empty, ``on`` for a true switch, ``off`` for a false one; ValueError
    for anything else."""
    raw = os.environ.get(variable, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in choices:
        return value
    if value in _TRUE or value in _FALSE:
        return on if value in _TRUE else off
    raise ValueError(f"{variable} must be one of {', '.join(choices)} (or 1/0 for {on}/{off}), not {raw!r}")
