"""What the pod tells the world and reads of Kubernetes: the LoRAAdapter watch and status patches (kube), this
pod's status entries (publish), readiness, the load each adapter brings (usage), and Prometheus metrics (metrics).

Reads the plan's records (reconcile) and never changes them; knows nothing of S3 or the cache.
"""
