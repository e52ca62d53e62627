"""``NamedTuple`` for modules on a createContainer hook's start-up path.

``typing`` costs a hook process about 11 ms of CPU at import (it pulls in ``re``,
``functools``, ``contextlib`` ...), more than the hook's whole work; the readers in
:mod:`cdi.linux` need it only for ``class X(NamedTuple)``.  Type checkers see
``typing.NamedTuple`` itself; at run time the class body becomes a
``collections.namedtuple`` with the same fields, defaults, docstring, methods and
properties, which is what ``typing.NamedTuple`` builds too.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from collections import namedtuple as _namedtuple

    # What the class body defines that is not a member to copy onto the namedtuple.
    _SKIP = frozenset({"__annotations__", "__module__", "__qualname__", "__doc__",
                       "__dict__", "__weakref__", "__orig_bases__"})

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, namespace):
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, namespace)
            fields = list(namespace.get("__annotations__", {}))
            defaults = [namespace[f] for f in fields if f in namespace]
            if any(f not in namespace for f in fields[len(fields) - len(defaults):]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            cls = _namedtuple(name, fields, defaults=defaults,
                              module=namespace.get("__module__"))
            cls.__qualname__ = namespace.get("__qualname__", name)
            if namespace.get("__doc__"):
                cls.__doc__ = namespace["__doc__"]
            for key, value in namespace.items():
                if key not in _SKIP and key not in fields:
                    setattr(cls, key, value)
            return cls

    class NamedTuple(metaclass=_NamedTupleMeta):
        """Base class: ``class X(NamedTuple): a: int; b: str = ""``."""

__all__ = ["NamedTuple"]
