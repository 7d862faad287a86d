"""The record install() keeps of what it patched, and its undo."""

import types

from moelora.vllm_plugin.patches import Patches


class Base:
    def method(self):
        return "base"


class Child(Base):
    def own(self):
        return "own"


def test_undo_restores_own_values_and_removes_what_was_inherited_last_first():
    module = types.SimpleNamespace(fn=len)
    original_own = Child.__dict__["own"]
    order = []
    patches = Patches()
    patches.on_undo(lambda: order.append("cleanup"))
    patches.set(Child, "method", lambda self: "ours")  # inherited before: Child held none of its own
    patches.set(Child, "own", lambda self: "ours too")
    patches.set(module, "fn", abs)
    patches.set(module, "fn", max)  # patched twice: undone back to the first original
    patches.on_undo(lambda: order.append(("after the patches", module.fn)))
    assert Child().method() == "ours" and module.fn is max
    assert [(p.owner, p.name) for p in patches.done[1:3]] == [(Child, "method"), (Child, "own")]

    patches.undo()
    assert "method" not in vars(Child) and Child().method() == "base"
    assert Child.__dict__["own"] is original_own
    assert module.fn is len
    assert order == [("after the patches", max), "cleanup"]  # last recorded, first undone
    assert not patches.done
    patches.undo()  # an empty record undoes nothing
    assert module.fn is len
