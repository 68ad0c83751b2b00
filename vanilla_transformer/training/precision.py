"""Training precision: whether bf16 autocast (`--bf16`) pays on this machine, which `--precision auto` follows (the
Multi30k recipe, the quality-parity run) and the CPU precision benchmark reports."""

import torch


def native_bf16() -> bool:
    """Whether this machine multiplies bf16 matrices natively: a CUDA GPU that supports bf16, or a CPU with
    AVX-512 BF16 / AMX (oneDNN's check). Elsewhere bf16 is emulated, far slower than float32."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


__all__ = ["native_bf16"]
