"""The reconcile loop and its wiring: kopf's handlers map events onto ModelServer keys (`mappers`, `resync`), the
keyed queue (`workqueue`) runs one pass per key (`controller`: observe, plan, apply), whose writes are
`model_servers`, `lora_adapters` and `placement_writes`; `context` is the memo every handler gets, `metrics` its
Prometheus side, `wiring` registers it all with kopf and runs it."""
