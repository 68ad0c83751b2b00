"""The measurement toolkit: workloads and peers, the one interleaved timer, the matmul peak and the report
writer, the parity runs and the GPU device check. Run its commands from the repository root as modules, e.g.
`python -m scripts.benchmarks.benchmark` (README.md here is the performance report)."""
