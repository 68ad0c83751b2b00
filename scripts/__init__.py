"""The command-line tools (run from the repository root); `scripts.benchmarks` is the measurement toolkit."""
