"""The moelora operator: thin kopf handlers around pure manifest builders, and one module that talks to the API.

Packages by role, each importing only those below it (.importlinter, contract `operator-layers`; docs/architecture.md,
"The operator's packages"):
- `control`: the loop and its wiring: kopf's handlers map events onto ModelServer keys (`mappers`, `resync`), the
  keyed queue (`workqueue`) runs one pass per key (`controller`), whose writes are `model_servers`, `lora_adapters`
  and `placement_writes`; `context` (the typed memo every handler gets), `metrics`, and `wiring`, which runs kopf;
- `kube`: talking to the API: `apply` (the only module that writes), `events` (Events, identical ones counted),
  `cache_sync` (the shared model cache's claims and Jobs);
- `decide`: a pass's pure decisions: `plan` over kopf's `indexes` and the operator's own writes (`expectations`),
  `placement` and `assignment` (which pods serve which adapters, and the moves), `rollup` (an adapter's status patch
  and its Event), `status` (reading what exists, and the status judged from it);
- `render`: pure builders from a spec to manifests: `naming`, `engine` (vLLM args/env, refused flags, over the
  bundled `engine_flags`), `model_shapes`, `kernel_configs`, `deployment`, `statefulset`, `multinode`, `service`,
  `disruption`, `autoscaling`, `gateway`, `secret_access`, `model_cache`, `model_download`, `pod_options`,
  `security`, and `children` (everything a ModelServer owns);
- at the top level: `policy` (the allowlists), `errors` (SpecProblem), `settings` (env -> Settings), `__main__`.
Run it with `python3 -m moelora.operator`.

Kubernetes access the operator needs (for the chart's ClusterRole, or Role per watched namespace); the chart's
test_chart_rbac_used.py records what the operator really asks for and checks it against exactly this:

| API group | resources | verbs |
|---|---|---|
| moelora.io | modelservers | get, list, watch, patch (kopf's progress annotations) |
| moelora.io | loraadapters | get, list, watch |
| moelora.io | modelservers/status, loraadapters/status | patch |
| moelora.io | modelservers/finalizers | update (owner references with blockOwnerDeletion, where admission checks it) |
| apps | deployments, statefulsets | get, list, watch, create, patch, delete (the kind spec.placement rules out) |
| "" (core) | services | get, create, patch, delete (the headless Service of spec.placement) |
| "" (core) | configmaps | get, create, patch, delete |
| policy | poddisruptionbudgets | get, create, patch, delete |
| rbac.authorization.k8s.io | roles, rolebindings | get, create, patch, delete (each server's adapter-Secret grant) |
| "" (core) | pods | get, list, watch |
| "" (core) | secrets | get (in the server namespaces: RBAC lets it grant only what it holds) |
| "" (core) | events | create, patch (an identical LoRAAdapter Event is counted on the stored one) |
| apiextensions.k8s.io | customresourcedefinitions | list, watch (kopf's resource scanning; only when
  MOELORA_NAMESPACES is empty, i.e. cluster-wide) |
| (discovery) | /api, /apis and group versions | get (every authenticated user has it by default) |
| kopf.dev | clusterkopfpeerings (all namespaces) or kopfpeerings (per namespace) | list, watch, patch; only
  with MOELORA_PEERING set, and the chart creates the peering object and its CRD |

It writes (patches, deletes) only objects whose controller ownerReference is their ModelServer's uid; a name
taken by anyone else's object is left alone and reported (NameTaken). Owned objects go with their ModelServer
through Kubernetes' garbage collector; its own deletions are the kernel-config ConfigMap, the PodDisruptionBudget
and the adapter-Secret Role/RoleBinding it rendered, once a server stops asking for them. No finalizer anywhere:
the periodic resync is an operator-level task (control/resync.py), so deletions never wait for the operator.
"""
