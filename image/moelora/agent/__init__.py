"""The adapter agent: a sidecar in every vLLM pod that makes vLLM serve its ModelServer's LoRAAdapters.

It watches LoRAAdapters (kube), downloads each one's files from S3 into a content-addressed cache (source, fetch,
cache), checks them before vLLM sees them (validate), loads, reloads and unloads them through vLLM's runtime LoRA
API (vllm), and writes this pod's key of each adapter's status. The plan of what to do is pure (reconcile); one
loop executes it (runner). Metrics and readiness are served on MOELORA_PORT (metrics).

Run as `python3 -m moelora.agent` (settings from the environment, see settings.py), or
`python3 -m moelora.agent fetch-model s3://bucket/prefix DEST` in the init container that fetches a base model.
"""
