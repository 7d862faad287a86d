"""What an adapter directory holds, as peft saves it: the names every other part of the agent looks for.

Here, below the checks, because the listing (store.source) refuses a prefix by the same rules before a byte is
fetched that validate applies to the files on disk.
"""

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_LIMIT = 2**20  # adapter_config.json is a few hundred bytes; anything this large is not one
# Pickle-based formats: torch.load on them can run arbitrary code, so they are refused outright.
UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
