# Call 3: both kinds as second pods from call 2's caches, a pass each (64 prompts).
STAGE=second bash .bundle/q/qwen3_h100.sh 2>&1 | tail -40
