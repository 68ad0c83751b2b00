"""The measurement toolkit, run as modules from the repository root (README.md here is the performance report)."""
