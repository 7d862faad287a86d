# Call 2 (after call1.sh on the same machine): both cold servers, start-up only.
MODES="plugin nolora" bash .bundle/q/gptoss_startup.sh
