"""Validation helpers shared by every config: sizes with units and positive integers."""
from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: int | str) -> int:
    """Turn 2147483648, "2GiB", "512MB" or "1.5 gib" into bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(f"cannot read size {value!r}: give bytes or a number with a unit like '2GiB' or '512MB'")
        size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


def check_positive_int(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` is an int >= 1 (bools are not ints here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
