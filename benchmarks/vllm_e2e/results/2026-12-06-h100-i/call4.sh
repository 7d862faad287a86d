# Call 4: both again, the other order; the plugin server's decode steps profiled after its pass.
STAGE=second PROFILE=plugin MODES="plugin.3 nolora.3" PLUGIN_S=200 MODE_S=120 bash .bundle/q/qwen3_h100.sh 2>&1 | tail -25
