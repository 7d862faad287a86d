# Call 2 (machine S, 22:02 UTC): gptoss_onegraph.sh's cold stage, 64 prompts; its PLUGIN_S (330) skipped the plugin.
NP=64 LIMIT=470 STAGE=cold bash .bundle/q/gptoss_onegraph.sh
