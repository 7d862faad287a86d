"""Write a minimal dist-info declaring the plugin's entry point, so vLLM's loader finds it on a machine where the
repo is only on PYTHONPATH rather than pip-installed (vLLM discovers general plugins only through installed
distributions' `vllm.general_plugins` entry points).
Usage: python make_entry_point.py DIR   (then put DIR, image/ and kernels/ on PYTHONPATH)"""

import pathlib
import sys

info = pathlib.Path(sys.argv[1]) / "moelora_vllm_plugin-0.1.0.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text("Metadata-Version: 2.1\nName: moelora-vllm-plugin\nVersion: 0.1.0\n")
(info / "entry_points.txt").write_text("[vllm.general_plugins]\nmoelora = moelora.vllm_plugin:register\n")
print("entry point written to", info)
