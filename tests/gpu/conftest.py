"""GPU tests: compiled Triton kernels on a CUDA device; every test here is marked `gpu` and skips without CUDA."""
