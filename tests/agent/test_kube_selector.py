"""The agent asks the API server for its own server's adapters only, and falls back to filtering them itself where
the server cannot select LoRAAdapters by spec.modelServer (Kubernetes < 1.31 answers 400)."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from moelora.agent.report.kube import AdapterWatcher, Kube


class Custom:
    def __init__(self, *, refuse_selectors: bool) -> None:
        self.refuse_selectors = refuse_selectors
        self.calls: list[dict[str, Any]] = []

    def list_namespaced_custom_object(self, *_: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if self.refuse_selectors and "field_selector" in kwargs:
            raise ApiException(status=400, reason="BadRequest")
        return {"items": [], "metadata": {"resourceVersion": "7"}}


def kube_with(custom: Custom) -> Kube:
    kube = Kube.__new__(Kube)
    kube.namespace, kube.custom, kube.field_selectors = "ns", custom, True
    return kube


def test_lists_select_the_servers_adapters() -> None:
    custom = Custom(refuse_selectors=False)
    assert kube_with(custom).list_adapters(model_server="srv") == ([], "7")
    assert custom.calls[0]["field_selector"] == "spec.modelServer=srv"


def test_a_server_that_refuses_the_selector_gets_plain_lists_from_then_on() -> None:
    custom = Custom(refuse_selectors=True)
    kube = kube_with(custom)
    assert kube.list_adapters(model_server="srv") == ([], "7")
    kube.list_adapters(model_server="srv")
    assert ["field_selector" in call for call in custom.calls] == [True, False, False]


def test_status_only_events_are_dropped_before_parsing() -> None:
    changes: list[None] = []
    watcher = AdapterWatcher(
        kube=kube_with(Custom(refuse_selectors=False)), model_server="srv", on_change=lambda: changes.append(None)
    )
    obj = {
        "metadata": {"name": "a", "generation": 1},
        "spec": {"modelServer": "srv", "source": {"uri": "s3://bucket/a/"}},
    }
    watcher._apply("ADDED", obj)
    parsed = watcher._parse
    watcher._parse = lambda _: (_ for _ in ()).throw(AssertionError("parsed a status-only event"))  # type: ignore[method-assign]
    watcher._apply("MODIFIED", {**obj, "status": {"replicas": {"other-pod": {"loaded": True}}}})
    watcher._parse = parsed  # type: ignore[method-assign]
    watcher._apply(
        "MODIFIED", {**obj, "metadata": {"name": "a", "generation": 2}, "spec": {**obj["spec"], "servedName": "b"}}
    )
    assert len(changes) == 2 and watcher.snapshot()[0].spec.served_name == "b"
