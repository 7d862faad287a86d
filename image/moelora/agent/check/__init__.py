"""Whether an adapter's files are safe to give vLLM, and the one rewrite of them vLLM needs (peft_moe).

Pure functions of files on disk, the adapter's config and the base model's config.json: nothing here talks to S3,
vLLM or Kubernetes, and nothing here imports another part of the agent but its errors. Each refusal is an
AdapterError with its own FailureReason.
"""
