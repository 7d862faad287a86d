# On a GPU other than the H200 the tables are looked up under its own name: serve the H200's under that name (same
# sm_90 and SM count on an H100), so the plugin runs the configs it runs on the H200.
G=$(python3 -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_').replace('-', '_'))")
echo "GPU tables as $G"
if [ "$G" != NVIDIA_H200 ]; then
  C=kernels/moelora/kernels/configs
  cp "$C/NVIDIA_H200.json" "$C/$G.json"
  for f in "$C"/NVIDIA_H200/*; do b=$(basename "$f"); cp "$f" "$C/NVIDIA_H200/${b//NVIDIA_H200/$G}"; done
  ls "$C/NVIDIA_H200" | grep -c "$G"
fi
