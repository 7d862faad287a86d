# The vLLM archive unpacked once per machine (as qwen3_h100.sh does it; needs probe_bare.sh's /tmp/part.aa), then the
# MoE fold probe with vLLM's own GEMM beside it.
T=$(date +%s); SITE=/tmp/vllm-site
[ -f /tmp/vllm-site.tar.xz ] || cat /tmp/part.aa .bundle/b/part.ab > /tmp/vllm-site.tar.xz || exit 4
if [ ! -f $SITE/.done ]; then
  mkdir -p $SITE && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='tar')" \
    /tmp/vllm-site.tar.xz $SITE || exit 3
  python3 -m compileall -q -j 16 $SITE image kernels > /dev/null 2>&1; touch $SITE/.done
  echo "archive unpacked in $(( $(date +%s) - T )) s"
fi
bash .bundle/q/probe_bare.sh
