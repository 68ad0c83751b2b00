"""Training precision: whether bf16 autocast (`--bf16`) pays on this machine, which `--precision auto` follows (the
Multi30k recipe, the quality-parity run) and the CPU precision benchmark reports."""

import time

import torch


def _matmul_seconds(dtype: torch.dtype, size: int = 512, repeats: int = 8) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(3):  # the first round pays for oneDNN's kernel selection
            start = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    return best


def native_bf16() -> bool:
    """Whether this machine multiplies bf16 matrices natively: a CUDA GPU that supports bf16 (torch's own check), or a
    CPU whose bf16 matrix product beats its float32 one, timed here (torch has no public test of a CPU's bf16
    instructions; with AVX-512 BF16 or AMX the product is faster, where bf16 is emulated far slower)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return _matmul_seconds(torch.bfloat16) < _matmul_seconds(torch.float32)


__all__ = ["native_bf16"]
