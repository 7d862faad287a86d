# Call 2: the machine set up, the half-depth model and its 8 adapters made, cold plugin then cold no LoRA, start-up only.
STAGE=cold bash .bundle/q/qwen3_h100.sh 2>&1 | tail -60
