# Call 2 (after call1.sh on the same machine): both cold servers, start-up only. .bundle/q/gptoss_startup.sh is
# ../2026-12-06-h100-g/call2.sh, unchanged.
MODES="plugin nolora" bash .bundle/q/gptoss_startup.sh
