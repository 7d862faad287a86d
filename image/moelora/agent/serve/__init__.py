"""Talking to vLLM: its runtime LoRA API (vllm), putting prepared files into it (loader), the admin routes' key
(admin_key), adapters served on first request (ondemand, holding), and adapters someone else loaded (foreign).

Each of these runs on the loop's thread or answers vLLM's resolver; the files they hand vLLM were prepared below
(prepare, store, check).
"""
