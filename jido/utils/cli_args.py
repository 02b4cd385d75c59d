"""Build argparse options from dataclass fields, so config classes stay the single source of flags."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Add ``--field-name`` for every init field of ``cls``; the default stays the dataclass's own."""
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind, is_list = _field_kind(str(f.type))
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, dest=f.name, type=kind, nargs="+" if is_list else None, default=None,
                                metavar=f.name.upper())


def dataclass_kwargs(args: argparse.Namespace, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options the user actually gave, as keyword arguments for ``cls``."""
    names = {f.name for f in dataclasses.fields(cls) if f.init and f.name not in skip}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def _field_kind(annotation: str) -> tuple[type, bool]:
    parts = [p.strip() for p in annotation.split("|") if p.strip() != "None"]
    is_list = any(p.startswith("list[") for p in parts)
    for part in parts:
        inner = part[5:-1] if part.startswith("list[") else part
        if inner in _TYPES:
            # "int | str" (sizes like 2GiB) is read as text and parsed by the config itself.
            return (str if "str" in parts else _TYPES[inner]), is_list
    return str, is_list
