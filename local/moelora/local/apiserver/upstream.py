"""Other projects' kinds as their published CRDs declare them: the files in `upstream_crds/`, vendored byte for byte
and loaded as they are (see its README). The emulator serves a kind only when a test or the stack says its cluster
has the CRD installed (`Emulator.serve_published`), and then admits each object as kube-apiserver would
(`crvalidation`: pruning, defaults, the schema and every CEL rule), refusing with 422 Invalid and the server's words.
Tests ask `admission()` directly for what a server would store or refuse.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.resources
from typing import Any

import kmock
import yaml

from moelora.local.apiserver import crvalidation, fielderrors
from moelora.local.apiserver.fielderrors import FieldError

# Kind -> the file its CRD is served from by default: the newest release vendored.
PUBLISHED = {
    "InferencePool": "gie-v1.6.0-inferencepools.yaml",
    "HTTPRoute": "gwapi-v1.6.1-httproutes.yaml",
    "LeaderWorkerSet": "lws-v0.10.0.yaml",
    "ScaledObject": "keda-v2.20.2-scaledobjects.yaml",
    "PodMonitor": "promop-podmonitors.yaml",
    "ServiceMonitor": "promop-servicemonitors.yaml",
}
# Every release of the Inference Extension's InferencePool vendored: a platform may run any of them.
INFERENCE_POOL_RELEASES = (
    "gie-v1.0.0-inferencepools.yaml",
    "gie-v1.5.0-inferencepools.yaml",
    PUBLISHED["InferencePool"],
)


def folder() -> Any:
    """The vendored files' folder (package data, found wherever the package is)."""
    return importlib.resources.files("moelora.local.apiserver") / "upstream_crds"


def files() -> list[str]:
    return sorted(entry.name for entry in folder().iterdir() if entry.name.endswith(".yaml"))


@functools.cache
def crd(file: str) -> dict[str, Any]:
    """The one CustomResourceDefinition a vendored file holds, parsed as published."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: 1.3 MB of LeaderWorkerSet in 0.5 s, not 5
    [found] = [doc for doc in yaml.load_all((folder() / file).read_text(), Loader=loader) if doc]
    if found.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{file} holds a {found.get('kind')}, not a CustomResourceDefinition")
    return dict(found)


@dataclasses.dataclass(frozen=True)
class ServedVersion:
    """One served version of a published CRD: what the emulator declares and how it admits an object."""

    kind: str
    group: str
    version: str
    plural: str
    schema: dict[str, Any]
    info: kmock.ResourceInfo

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"

    def admit(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> None:
        """Prune and default `obj` in place as the server would store it. Raises kmock.KubernetesError 422 Invalid
        (the server's message and causes) when the schema or a CEL rule refuses it."""
        errors = crvalidation.admit(obj, self.schema, old)
        if errors:
            name = str((obj.get("metadata") or {}).get("name", ""))
            raise fielderrors.invalid_error(kind=self.kind, group=self.group, name=name, errors=errors)


def served_versions(file: str) -> list[ServedVersion]:
    spec = crd(file)["spec"]
    names = spec["names"]
    return [
        ServedVersion(
            kind=names["kind"],
            group=spec["group"],
            version=version["name"],
            plural=names["plural"],
            schema=version["schema"]["openAPIV3Schema"],
            info=kmock.ResourceInfo(
                namespaced=spec["scope"] == "Namespaced",
                kind=names["kind"],
                singular=names.get("singular", names["kind"].lower()),
                shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                subresources=set(version.get("subresources", {})),
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
            ),
        )
        for version in spec["versions"]
        if version.get("served", True)
    ]


def version_of(obj: dict[str, Any], file: str | None = None) -> ServedVersion:
    """The served version an object's apiVersion names, from `file` or its kind's default file."""
    kind = obj.get("kind", "")
    if file is None and kind not in PUBLISHED:
        raise KeyError(f"no published CRD vendored for kind {kind!r} (known: {', '.join(sorted(PUBLISHED))})")
    for served in served_versions(file or PUBLISHED[kind]):
        if f"{served.group}/{served.version}" == obj.get("apiVersion") and served.kind == kind:
            return served
    raise KeyError(f"{file or PUBLISHED[kind]} serves no {obj.get('apiVersion')} {kind}")


@dataclasses.dataclass(frozen=True)
class Admission:
    """What a server with the published CRD makes of an object on create (or update, given the stored one)."""

    stored: dict[str, Any]  # pruned and defaulted, as it would be stored
    pruned: list[str]  # fields the schema does not declare: the server drops them without a word
    errors: list[FieldError]

    @property
    def message(self) -> str | None:
        """The 422's message, None when the object is accepted."""
        if not self.errors:
            return None
        name = str((self.stored.get("metadata") or {}).get("name", ""))
        kind, group = self.stored.get("kind", ""), str(self.stored.get("apiVersion", "")).rpartition("/")[0]
        return fielderrors.invalid_message(kind=kind, group=group, name=name, errors=self.errors)


def admission(obj: dict[str, Any], *, old: dict[str, Any] | None = None, file: str | None = None) -> Admission:
    """Admit a copy of `obj` against its kind's published CRD (or the one in `file`)."""
    served = version_of(obj, file)
    stored = copy.deepcopy(obj)
    pruned = crvalidation.prune(stored, served.schema)
    errors = crvalidation.admit(stored, served.schema, old)
    return Admission(stored=stored, pruned=pruned, errors=errors)
