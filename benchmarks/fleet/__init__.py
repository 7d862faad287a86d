"""A fleet simulator for issue 19: many adapters on many vLLM replicas, all-on-all vs placement + affinity routing.

`core` models one replica (vLLM's GPU and CPU adapter LRUs and its serial adapter loader) and the request loop;
`workload` draws requests; `simulate` is the CLI that runs the grid, prints tables and writes the plot. Run it from
the repository root with `PYTHONPATH=operator:image:kernels:benchmarks .venv/bin/python -m fleet.simulate`.
"""
