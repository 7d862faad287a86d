"""A record of the attributes the plugin replaced in vLLM, so that they can be put back exactly.

install.py hands one `Patches` to each part it installs; a part sets attributes through it (and may add a cleanup of
its own state), and uninstall() undoes the record in reverse order. Nothing is found again by name afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Patch", "Patches"]

_ABSENT = object()


@dataclass(frozen=True)
class Patch:
    """owner.name was set; `original` is the value the owner itself held before, or a private marker when it held
    none (the attribute came from a base class or did not exist), in which case undoing deletes it."""

    owner: object
    name: str
    original: object

    def undo(self) -> None:
        if self.original is _ABSENT:
            if self.name in vars(self.owner):
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.original)


@dataclass
class Patches:
    """What was patched, in order, plus cleanups of the plugin's own state to run when it is undone."""

    done: list[Patch | Callable[[], None]] = field(default_factory=list)

    def set(self, owner: object, name: str, value: object) -> None:
        """owner.name = value, recording the owner's own previous value."""
        self.done.append(Patch(owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, value)

    def on_undo(self, cleanup: Callable[[], None]) -> None:
        """Run cleanup() when the record is undone (in reverse order with the patches)."""
        self.done.append(cleanup)

    def undo(self) -> None:
        """Put back everything recorded, last first, and forget it."""
        while self.done:
            entry = self.done.pop()
            if isinstance(entry, Patch):
                entry.undo()
            else:
                entry()
