"""Sizes and times, parsed and formatted in one place.

Decimal units are powers of ten (GB = 10**9) and binary units powers of two
(GiB = 2**30), as users of nvidia-smi and cloud price lists expect.
"""

from __future__ import annotations

import math
import re

# Bytes of one element of each floating-point dtype a profile is taken in.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """'24GB' -> 24_000_000_000, '24GiB' -> 25_769_803_776, '512 MiB', '1.5TB', '1000'."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(
            f"cannot read size {text!r}: write a number with an optional unit, "
            "e.g. 24GB, 24GiB, 512MiB, 1.5TB or 1000 (bytes)"
        )
    num_bytes = float(match.group(1)) * _SIZE_UNITS[unit]
    if num_bytes <= 0:
        raise ValueError(f"size {text!r} must be greater than zero")
    if not math.isfinite(num_bytes):  # '1e400GB' overflows to inf, which int() refuses
        raise ValueError(f"size {text!r} is too large")
    if num_bytes < 1:  # '0.1' is a tenth of a byte, not 0.1 GB
        raise ValueError(f"size {text!r} is less than one byte; give a unit, e.g. {match.group(1)}GB")
    return int(round(num_bytes))


def parse_memory(text: str) -> int:
    """A memory's size (a device's cap, a host's): as parse_size, but a number without a unit under a
    MiB is refused, where parse_size reads it as bytes: '--mem 24' meant 24 GB, and read as 24 bytes
    it fits nothing and the refusal came after a solve, as a cap '69118651633% over'."""
    num_bytes = parse_size(text)
    match = _SIZE_RE.match(str(text))
    if not match.group(2) and num_bytes < 2**20:
        number = match.group(1)
        raise ValueError(f"size {str(text).strip()!r} has no unit, so it reads as {num_bytes} bytes, less than any "
                         f"memory holds; give one, e.g. {number}GB or {number}GiB ({number}B if bytes are meant)")
    return num_bytes


def parse_size_list(text: str, *, memory: bool = False) -> list[int]:
    """'24GB' -> [24e9]; '80GB,80GB,40GB' -> one size per stage (each read by parse_memory if `memory`)."""
    parts = [part for part in str(text).split(",")]
    if any(not part.strip() for part in parts):
        raise ValueError(f"cannot read size list {text!r}: separate sizes by commas, e.g. 80GB,80GB,40GB")
    return [(parse_memory if memory else parse_size)(part) for part in parts]


def format_bytes(num_bytes: float, *, round_up: bool = False) -> str:
    """Binary units, up to three significant digits: 1536 -> '1.5 KiB', 1000 -> '1000 B'.
    With round_up the printed value is never below the true one (a cap to type back in)."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{math.ceil(value) if round_up else value:.0f} {unit}"
            if round_up and value > 0:
                step = 10.0 ** (math.floor(math.log10(value)) - 2)
                value = math.ceil(value / step - 1e-9) * step
            return f"{value:.4g} {unit}" if value >= 999.5 else f"{value:.3g} {unit}"  # 1000-1023: not 1e+03
        value /= 1024
    raise AssertionError("unreachable")


def format_ms(time_ms: float) -> str:
    if time_ms >= 1000:
        return f"{time_ms / 1000:.2f} s"
    return f"{time_ms:.3g} ms" if time_ms >= 1 else f"{time_ms * 1000:.3g} µs"
