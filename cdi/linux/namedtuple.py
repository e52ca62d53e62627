"""``NamedTuple`` for modules on a createContainer hook's start-up path.

Importing ``typing`` (``re``, ``functools``, ``contextlib`` ...) or ``collections`` costs a
hook process more than the part of its work they would serve: ``class X(NamedTuple)``.
Type checkers see ``typing.NamedTuple`` itself; at run time the class body becomes a tuple
subclass with the same fields, defaults, methods and the namedtuple API (``_fields``,
``_field_defaults``, ``_replace``, ``_asdict``, ``_make``, keywords, pickling).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    # What the class body defines that is not a member to copy onto the tuple class.
    _SKIP = frozenset({"__annotations__", "__module__", "__qualname__", "__dict__",
                       "__weakref__", "__orig_bases__"})

    def _field(index, name):
        return property(lambda self: self[index], doc=f"Alias for field number {index}")

    # One closure-building function, kept for the hook's start-up (measured:
    # bench/reports/2026-11-29-hook-shortcuts-2-cores).
    def _methods(name, fields, defaults):  # noqa: C901
        required = len(fields) - len(defaults)

        def __new__(cls, *args, **kwargs):
            if not kwargs and len(args) == len(fields):
                return tuple.__new__(cls, args)
            if len(args) > len(fields):
                raise TypeError(f"{name}() takes {len(fields)} arguments, {len(args)} given")
            values = list(args)
            for i in range(len(args), len(fields)):
                if fields[i] in kwargs:
                    values.append(kwargs.pop(fields[i]))
                elif i >= required:
                    values.append(defaults[i - required])
                else:
                    raise TypeError(f"{name}() missing required argument {fields[i]!r}")
            if kwargs:
                raise TypeError(f"{name}() got unexpected or repeated arguments {sorted(kwargs)}")
            return tuple.__new__(cls, values)

        def __repr__(self):
            inner = ", ".join(f"{f}={v!r}" for f, v in zip(fields, self, strict=True))
            return f"{type(self).__name__}({inner})"

        def _replace(self, **changes):
            return type(self)(**{**self._asdict(), **changes})

        def _asdict(self):
            return dict(zip(fields, self, strict=True))

        @classmethod
        def _make(cls, iterable):
            values = tuple(iterable)
            if len(values) != len(fields):
                raise TypeError(f"expected {len(fields)} arguments, got {len(values)}")
            return tuple.__new__(cls, values)

        def __getnewargs__(self):
            return tuple(self)

        return {"__new__": __new__, "__repr__": __repr__, "_replace": _replace,
                "_asdict": _asdict, "_make": _make, "__getnewargs__": __getnewargs__}

    class _NamedTupleMeta(type):
        def __new__(mcls, name, bases, namespace):
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, namespace)
            fields = tuple(namespace.get("__annotations__", {}))
            defaults = tuple(namespace[f] for f in fields if f in namespace)
            if any(f not in namespace for f in fields[len(fields) - len(defaults):]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            body = {k: v for k, v in namespace.items() if k not in _SKIP and k not in fields}
            body.update(_methods(name, fields, defaults))
            body.update({f: _field(i, f) for i, f in enumerate(fields)})
            body.update(__slots__=(), _fields=fields, __match_args__=fields,
                        _field_defaults=dict(zip(fields[len(fields) - len(defaults):],
                                                 defaults, strict=True)))
            body.setdefault("__doc__", f"{name}({', '.join(fields)})")
            cls = type.__new__(type, name, (tuple,), body)
            cls.__module__ = namespace.get("__module__", cls.__module__)
            cls.__qualname__ = namespace.get("__qualname__", name)
            return cls

    class NamedTuple(metaclass=_NamedTupleMeta):
        """Base class: ``class X(NamedTuple): a: int; b: str = ""``."""

__all__ = ["NamedTuple"]
