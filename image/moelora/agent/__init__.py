"""The adapter agent: a sidecar in every vLLM pod that makes vLLM serve its ModelServer's LoRAAdapters.

It watches LoRAAdapters and writes this pod's key of each adapter's status (report.kube, report.publish), downloads
each adapter's files from S3 into a content-addressed cache (store), checks them before vLLM sees them (check),
and loads, reloads and unloads them through vLLM's runtime LoRA API (serve). The plan of what to do is pure
(reconcile); a worker pool prepares each version (prepare: store, then check); one loop executes the plan (runner).
Metrics and readiness are served on MOELORA_PORT (report.metrics).

The subpackages only import downward (`.importlinter`, docs/architecture.md "The agent's packages"): __main__,
runner, serve, prepare, report | store, reconcile, check, errors | settings.

Run as `python3 -m moelora.agent` (settings from the environment, see settings.py), or
`python3 -m moelora.agent fetch-model s3://bucket/prefix DEST` in the init container that fetches a base model.
"""
