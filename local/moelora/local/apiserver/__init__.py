"""A Kubernetes API on loopback for the tests and the local stack: kmock's emulator with what kopf and kubectl need.

What belongs here is the API server and the ways to reach it, one concern a module: `schema` (the checks a real
server makes on our custom objects), `encoding` (built-in objects as the server stores them), `garbage` (the
garbage collector: an object whose owners are all absent goes), `objects` (pure helpers on stored objects),
`selectors` (label and field selectors as a real server parses them), `watchlog` (the event log that lets a watch
resume from a list), `tables` and `printers` (the Tables `kubectl get` prints),
`openapi` (OpenAPI v3 for `kubectl explain` and strict field validation), `crds` (our CRDs as kmock resources),
`dispatch` (the requests served without kmock's reaction matching), `emulator` (kmock's emulator with those added),
`server` (`KubeAPI`: the emulator over HTTP in its own thread), `kubectl` (kubeconfig and the kubectl binary),
`client` (a small REST client), `crd_rules` and `crd_defaults` (what the server refuses in a
CustomResourceDefinition's schemas), `dryrun` (server-side dry runs), `upstream` (other projects' CRDs, vendored in
`upstream_crds/` as published, served once declared), `crvalidation` (a custom object admitted as the server admits
it: pruning, defaults, the OpenAPI schema), `celrules` and `celib` (every CEL rule, for custom objects and CRD
defaults alike, evaluated as the server evaluates it with the Kubernetes CEL libraries), `fielderrors` (field errors
and the 422 Invalid, worded as kube-apiserver v1.36 words them). What runs against it (the operator, the kubelet)
lives beside this package, not in it.
"""

from moelora.local.apiserver.client import Rest
from moelora.local.apiserver.emulator import Emulator
from moelora.local.apiserver.kubectl import kubectl_binary, write_kubeconfig
from moelora.local.apiserver.objects import merge_diff
from moelora.local.apiserver.schema import apply_defaults, schema_errors
from moelora.local.apiserver.server import KubeAPI

__all__ = [
    "Emulator",
    "KubeAPI",
    "Rest",
    "apply_defaults",
    "kubectl_binary",
    "merge_diff",
    "schema_errors",
    "write_kubeconfig",
]
