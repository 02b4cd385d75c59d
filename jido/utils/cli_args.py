"""Build argparse options from dataclass fields, so config classes stay the single source of flags and help.

A field's help is its attribute docstring, the string literal written right under it in the class body
(the convention Sphinx and vLLM's configs use), else the comment at the end of its line; then its default.
A ``Literal[...]`` type gives the choices. So ``--help`` says what the dataclass says and cannot drift.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
import typing
from typing import Any

_SCALARS = (int, float, str, bool)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """Add ``--field-name`` for every init field of ``cls``; the default stays the dataclass's own.

    Every option's value is None unless given, so :func:`dataclass_kwargs` passes only what the user set.
    """
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__, description=summary(cls))
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind, is_list, choices = field_kind(hints[f.name])
        help_text = field_help(cls, f)
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            group.add_argument(flag, dest=f.name, type=kind, nargs="+" if is_list else None, default=None,
                                choices=choices, metavar=None if choices else f.name.upper(), help=help_text)


def dataclass_kwargs(args: argparse.Namespace, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options the user actually gave, as keyword arguments for ``cls``."""
    names = {f.name for f in dataclasses.fields(cls) if f.init and f.name not in skip}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def field_help(cls: type, f: dataclasses.Field) -> str:
    """The field's docstring and, unless the docstring already speaks of it, ``(default: X)``."""
    doc = field_docs(cls).get(f.name, "")
    if "default" in doc.lower():
        return doc
    return f"{doc.rstrip('.')} (default: {_shown(f)})".strip()


def summary(cls: type) -> str:
    """The first line of the class's docstring, without reST's double backquotes."""
    return (inspect.getdoc(cls) or "").split("\n", 1)[0].replace("``", "")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (else its line's trailing comment), whitespace collapsed, for ``cls`` and its
    bases; {} for a class whose source cannot be read."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        try:
            lines = textwrap.dedent(inspect.getsource(klass)).splitlines()
        except (OSError, TypeError):
            continue
        tree = ast.parse("\n".join(lines))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                doc = _docstring(after) or _trailing_comment(lines[node.end_lineno - 1], node.end_col_offset)
                if doc:
                    docs[node.target.id] = " ".join(doc.split())
    return docs


def _docstring(node: ast.stmt | None) -> str:
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return node.value.value
    return ""


def _trailing_comment(line: str, end_col: int) -> str:
    # ast columns count UTF-8 bytes.
    rest = line.encode()[end_col:].decode().strip()
    return rest[1:] if rest.startswith("#") else ""


def field_kind(annotation: Any) -> tuple[type, bool, tuple | None]:
    """(the type argparse converts to, whether the flag takes a list, the Literal's values or None)."""
    parts = [a for a in _union_args(annotation) if a is not type(None)]
    is_list = any(typing.get_origin(p) is list for p in parts)
    scalars = [typing.get_args(p)[0] if typing.get_origin(p) is list else p for p in parts]
    literals = [p for p in scalars if typing.get_origin(p) is typing.Literal]
    if literals:
        choices = tuple(v for p in literals for v in typing.get_args(p))
        return type(choices[0]), is_list, choices
    # "int | str" (sizes like 2GiB) is read as text and parsed by the config itself.
    if str in scalars or not any(s in _SCALARS for s in scalars):
        return str, is_list, None
    return next(s for s in scalars if s in _SCALARS), is_list, None


def _union_args(annotation: Any) -> tuple:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    return (annotation,)


def _shown(f: dataclasses.Field) -> str:
    value = f.default
    if value is dataclasses.MISSING:
        return "computed" if f.default_factory is not dataclasses.MISSING else "required"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)
