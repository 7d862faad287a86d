# Call 4: second pods of both kinds again, one pass each (128 prompts).
MODES="nolora.2 plugin.2" LIMIT=430 bash .bundle/q/gptoss_uniform2.sh
