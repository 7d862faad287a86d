"""The moelora operator: thin kopf handlers around pure manifest builders, and one module that talks to the API.

Modules, one concern each, the lower layers first:
- pure builders: `settings` (env -> Settings), `naming` (labels, names), `errors` (SpecProblem), `vllm_flags`
  (vLLM's flags, bundled), `engine` (vLLM args/env, refused flags), `model_shapes` (a model's MoE shape),
  `kernel_configs` (the tuned-config volume), `deployment`, `service`, `disruption` (the PodDisruptionBudget),
  `children` (everything a ModelServer owns), `status` (reading what exists, and the status judged from it);
- `apply`: the only module that talks to the Kubernetes API (reads, status patches, create-or-patch, delete);
- `context` (the typed memo every handler gets), `indexes` (kopf's indexes);
- handlers by resource: `model_servers`, `lora_adapters`; `wiring` registers them and runs kopf.
Run it with `python3 -m moelora.operator`.

Kubernetes access the operator needs (for the chart's ClusterRole, or Role per watched namespace):

| API group | resources | verbs |
|---|---|---|
| moelora.io | modelservers, loraadapters | get, list, watch, patch |
| moelora.io | modelservers/status, loraadapters/status | get, patch |
| apps | deployments | get, list, watch, create, patch |
| "" (core) | services | get, list, watch, create, patch |
| "" (core) | configmaps | get, list, watch, create, patch, delete |
| policy | poddisruptionbudgets | get, create, patch, delete |
| "" (core) | pods | get, list, watch |
| "" (core) | secrets | get |
| "" (core) | events | create |
| apiextensions.k8s.io | customresourcedefinitions | list, watch (kopf's resource scanning; only when
  MOELORA_NAMESPACES is empty, i.e. cluster-wide) |
| (discovery) | /api, /apis and group versions | get (every authenticated user has it by default) |
| kopf.dev | clusterkopfpeerings (all namespaces) or kopfpeerings (per namespace) | get, list, watch, patch; only
  with MOELORA_PEERING set, and the chart creates the peering object and its CRD |

Handlers' own reads/writes: create + patch Deployments/Services/ConfigMaps/PodDisruptionBudgets, delete the
ConfigMap and the PodDisruptionBudget it rendered once the server stops asking for them;
get Secrets (only to check that spec.s3.credentialsSecret exists) and ConfigMaps (kernels.configs=configMap);
patch status of both kinds.

Owned objects carry ownerReferences to their ModelServer, and Kubernetes' garbage collector removes them with it;
its own deletions are the kernel-config ConfigMap and the PodDisruptionBudget it rendered, once a server stops
asking for them (kernels.configs no longer auto; fewer than two replicas).
"""
