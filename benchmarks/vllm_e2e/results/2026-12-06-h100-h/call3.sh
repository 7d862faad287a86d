# Call 3: the second pods, start-up only; plugin.3 runs the model warm-up though the marker is there.
# .bundle/q/gptoss_startup.sh is ../2026-12-06-h100-g/call2.sh, unchanged.
MODES="plugin.2 nolora.2 plugin.3" LIMIT=400 bash .bundle/q/gptoss_startup.sh
