# Call 1: the archive's first half parked in /tmp; the capture-lock test on a real driver (torch only) meanwhile.
T=$(date +%s); cp .bundle/a/part.aa /tmp/part.aa || exit 4
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=kernels:image:operator timeout 120 python3 -m pytest -c /dev/null --rootdir=. -q -p no:cacheprovider \
  tests/gpu/test_capture_pins_gpu.py > "$OUT/gpu_capture_pins.txt" 2>&1; echo "rc=$? after $(( $(date +%s) - T )) s" >> "$OUT/gpu_capture_pins.txt"
tail -15 "$OUT/gpu_capture_pins.txt"
