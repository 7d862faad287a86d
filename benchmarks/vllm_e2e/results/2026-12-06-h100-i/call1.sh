# Call 1 ran ../2026-12-05-h100-c/call1.sh, unchanged: the archive's first half parked in /tmp, the GPU test.
