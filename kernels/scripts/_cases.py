"""What the A/B scripts beside this file share: the benchmark cases named on their command line, and config
changes given as JSON."""

from dataclasses import replace

from moelora.kernels.tools import bench


def cases(specs: str):
    """Print the copy bandwidth, then yield (spec, bench.Case, copy bandwidth) for each model:rank:adapters:M of the
    comma list."""
    bw = bench.copy_bandwidth()
    print(f"copy bw {bw / 1e12:.3f} TB/s", flush=True)
    for spec in specs.split(","):
        model, rank, adapters, m = spec.split(":")
        yield spec, bench.Case(model, int(rank), int(adapters), int(m)), bw


def changed(cfg: bench.LayerConfig, changes: dict) -> bench.LayerConfig:
    """cfg with {"w13" | "w2": {KernelConfig field: value}} applied."""
    for op, fields in changes.items():
        cfg = replace(cfg, **{op: replace(getattr(cfg, op), **fields)})
    return cfg
