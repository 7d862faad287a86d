"""A fleet simulator (issues 19 and 28): many adapters on many vLLM replicas, all-on-all vs placement, one router.

`core` models one replica (its disk with on-demand loads, vLLM's GPU and CPU adapter LRUs and its serial adapter
loader), the Inference Extension's endpoint picker and the request loop; `workload` draws requests; `simulate` is
the CLI that runs the grid and prints a table. Run it from the repository root with
`PYTHONPATH=operator:image:kernels:benchmarks .venv/bin/python -m fleet.simulate`.
"""
