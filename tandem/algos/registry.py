"""A small typed name -> object registry.

Every pluggable algorithm piece (advantage estimator, policy loss, KL estimator, aggregation mode,
rollout correction, preference loss) is looked up by name in a ``Registry``. Two rules prevent the
silent failures of untyped dict registries: registering a name twice raises, and looking up an unknown
name raises an error that lists every valid name, so a typo in a config is a one-line fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name was looked up that is not registered. ``str(err)`` lists the valid names.

    Subclasses both ``KeyError`` (mapping semantics) and ``ValueError`` (bad config value).
    """

    def __str__(self) -> str:  # KeyError would repr() the message, adding quotes
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ValueError):
    """A name was registered twice in the same registry."""


class PluginError(ValueError):
    """A registered function from outside Tandem (a ``run.plugins`` module) raised, or returned what its
    registry cannot use. ``str(err)`` is one line naming the entry and where in the user's file; the
    trainer reports it against the config key that chose the entry."""


def call_registered(kind: str, name: str, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``; an exception raised by a function defined outside ``tandem`` becomes a
    :class:`PluginError` naming ``kind`` ``name`` and the line of the user's file it was raised from.
    Tandem's own functions are called as they are: their bugs keep their tracebacks."""
    module = getattr(fn, "__module__", None) or ""
    if module == "tandem" or module.startswith("tandem."):
        return fn(*args)
    try:
        return fn(*args)
    except Exception as exc:
        code = getattr(fn, "__code__", None)
        line, tb = None, exc.__traceback__
        while tb is not None:  # the deepest frame in the function's own file
            if code is not None and tb.tb_frame.f_code.co_filename == code.co_filename:
                line = f"{code.co_filename}:{tb.tb_lineno}"
            tb = tb.tb_next
        first = (str(exc).strip().splitlines() or [""])[0]
        at = f" at {line}" if line else ""
        raise PluginError(f"{kind} {name!r} raised {type(exc).__name__}{at}: {first}") from exc


class Registry(Generic[T]):
    """Maps names to objects of one type ``T``; insertion ordered; read-mostly.

    ``kind`` names what is registered (e.g. ``"advantage estimator"``) and appears in error messages.
    """

    def __init__(self, kind: str, item_type: type | None = None) -> None:
        self.kind = kind
        self.item_type = item_type  # when given, what add() accepts (a spec class holding the function)
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` under ``name``; raises :class:`DuplicateNameError` if taken, and
        :class:`TypeError` for an item that is not the registry's ``item_type`` (a bare function where a
        spec is expected would otherwise fail later, far from here)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if self.item_type is not None and not isinstance(item, self.item_type):
            spec = self.item_type.__name__
            raise TypeError(
                f"{self.kind} {name!r}: register {spec}(fn=...), not a {type(item).__name__} "
                "(docs/algorithms.md, 'Your own estimator or loss')"
            )
        if name in self._items:
            raise DuplicateNameError(f"{self.kind} {name!r} is already registered; pick another name")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@REGISTRY.register("name")``."""

        def deco(item: T) -> T:
            return self.add(name, item)

        return deco

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its object (a plugin or a test that registered an entry for a while);
        raises :class:`UnknownNameError` listing valid names."""
        item = self.get(name)
        del self._items[name]
        return item

    def get(self, name: str) -> T:
        """The object registered as ``name``; raises :class:`UnknownNameError` listing valid names."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            valid = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        """Registered names in registration order."""
        return list(self._items)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
