"""JSON form of the frozen domain dataclasses, driven by their type hints.

Snapshots must round-trip exactly so any cycle can be saved and replayed; deriving the codec
from the annotations keeps it in step with the types instead of a hand-written twin.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from fractions import Fraction
from functools import cache
from typing import Any

from scheduler.cluster.resources import Resources

__all__ = ["decode", "encode"]


def encode(value: Any) -> Any:
    """Turn a domain value into plain JSON data (dicts, lists, str, int, float, bool, None)."""
    if isinstance(value, Resources):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Fraction):
        return str(value)  # exact: "3/2", "16"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Fields computed in __post_init__ (init=False) are derived, not data.
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, tuple | list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def decode(tp: Any, data: Any) -> Any:
    """Rebuild a value of type ``tp`` from :func:`encode`'s output."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, data)
            except (TypeError, ValueError, KeyError):
                continue
        raise ValueError(f"cannot decode {data!r} as {tp}")
    if origin is typing.Literal:
        if data not in typing.get_args(tp):
            raise ValueError(f"{data!r} is not one of {typing.get_args(tp)}")
        return data
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in data)
        return tuple(decode(a, v) for a, v in zip(args, data, strict=True))
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        return {decode(key_t, k): decode(val_t, v) for k, v in data.items()}
    if tp is Resources:
        return Resources(data)
    if tp is Fraction:
        if not isinstance(data, str):
            raise TypeError(f"expected a fraction such as '3/2', got {data!r}")
        return Fraction(data)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {data!r}")
        hints = _hints(tp)
        kwargs = {
            f.name: decode(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.init and f.name in data
        }
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise TypeError(f"expected a number, got {data!r}")
        return float(data)
    if tp in (int, str, bool):
        if not isinstance(data, tp) or (tp is int and isinstance(data, bool)):
            raise TypeError(f"expected {tp.__name__}, got {data!r}")
        return data
    raise TypeError(f"unsupported type {tp!r}")
