"""A pass's decisions, pure: kopf's indexes and the operator's own writes (`indexes`, `expectations`) in, the plan
of one ModelServer's pass out (`plan`): placement (`placement`, `assignment`), the adapters' roll-ups and their
Events (`rollup`), and the statuses judged from what exists (`status`)."""
