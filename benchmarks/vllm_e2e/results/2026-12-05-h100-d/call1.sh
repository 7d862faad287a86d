# Calls 1 (machine P) and 5 (machine Q), carrying .bundle/a: the archive's first half parked in /tmp.
cp .bundle/a/part.aa /tmp/part.aa && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
