"""edgeinfer_bench: the benchmarks behind `edgeinfer bench` (developer machines; never on a device)."""
