# Call 3: the second pods, start-up only; plugin.3 runs the model warm-up though the marker is there.
MODES="plugin.2 nolora.2 plugin.3" LIMIT=400 bash .bundle/q/gptoss_startup.sh
