"""What every measurement here shares: the timer, the matmul peak, the environment a result records, the measured
subprocesses' environment, the tables and reports, and the Multi30k data."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from scripts.utils.reports import CPU_FLAGS_THAT_MATTER
from vanilla_transformer.data.corpora import available_cores

# The code each kind of measurement exercises (`environment(measures=...)`): the model's three files, and the engines.
MODEL_CODE = ("vanilla_transformer/configuration_vanilla_transformer.py",
              "vanilla_transformer/modeling_vanilla_transformer.py",
              "vanilla_transformer/support_vanilla_transformer.py")
ENGINE_CODE = (*MODEL_CODE, "vanilla_transformer/tools/translation.py", "vanilla_transformer/tools/engines.py",
               "vanilla_transformer/tools/exports.py", "vanilla_transformer/tools/ctranslate2.py",
               "vanilla_transformer/tools/onnx")


def time_interleaved(tasks: dict[str, Callable], repeats: int, warmup: int = 1,
                     device: torch.device | str | None = None) -> dict[str, list[float]]:
    """Seconds per call of each task, every task once a repetition, the order reversed every other repetition so that
    no slot (first, or right after a competitor) favours one system; on a GPU each call is waited for."""
    def synchronize():
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    names = list(tasks)
    times = {name: [] for name in names}
    for rep in range(warmup + repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            gc.collect()
            synchronize()
            start = time.perf_counter()
            tasks[name]()
            synchronize()
            if rep >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def matmul_peak(size: int, repeats: int = 5, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict:
    """The machine's practical matmul peak, the denominator of model-FLOPs utilisation: (size x size) @ (size x
    size), best and median of `repeats`, in FLOP/s."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = time_interleaved({"mm": lambda: torch.mm(a, b)}, repeats, warmup=2, device=device)["mm"]
    flops = 2 * size**3
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "flops": flops / min(times),
            "median_flops": flops / statistics.median(times)}


def load_average() -> list[float] | None:
    """Other processes on the cores inflate and scatter the times: a run records how busy the machine was."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def git_commit(paths: tuple[str, ...] = ()) -> str | None:
    """The commit the measured code is at, with "+" when `paths` (every tracked file if none) had uncommitted changes;
    None outside a clone."""
    git = ["git", "-C", str(Path(__file__).resolve().parents[2])]
    try:
        head = subprocess.run([*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", *paths],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def environment(device: torch.device | str | None = None, measures: tuple[str, ...] = ()) -> dict:
    """What a reader needs to trust a time: versions, commit and the code measured (`measures`: the paths whose change
    after this commit makes the figures stale, as scripts/utils/pages.py checks), the processor and its flags (Linux;
    elsewhere the platform's name and no flags) or the GPU, threads and how busy the machine was."""
    fields = {}
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        fields = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in lines if ":" in line)}
    present = set(fields.get("flags", "").split())
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda_build": torch.version.cuda,
            "transformers": transformers.__version__, "commit": git_commit(measures), "measures": list(measures),
            "cpu": fields.get("model name", platform.processor() or platform.machine()),
            "cpu_flags": [flag for flag in CPU_FLAGS_THAT_MATTER if flag in present],
            "cores_available": available_cores(), "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_average_at_start": load_average()}
    if device is not None and torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=str(device), gpu=props.name, capability=f"{props.major}.{props.minor}",
                    gpu_memory_gib=props.total_memory / 2**30, multiprocessors=props.multi_processor_count,
                    bf16_supported=torch.cuda.is_bf16_supported())
    return info


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment for a measured subprocess: offline (nothing is downloaded), with `extra`."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            **extra}


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that ran `python -m scripts.benchmarks.<module>`, as a report quotes it."""
    return shlex.join(["python", "-m", f"scripts.benchmarks.{module}", *(sys.argv[1:] if argv is None else argv)])


def multi30k_missing(data_dir, model: str | None = None) -> str | None:
    """Why Multi30k (train and val) cannot be used from `data_dir`, or `model` holds no trained model; else None."""
    missing = [name for name in ("train.en", "train.de", "val.en", "val.de") if not Path(data_dir, name).is_file()]
    if missing:
        return (f"Multi30k not found: {', '.join(missing)} missing in {Path(data_dir).resolve()} (it is research-use "
                f"data kept outside the repository, at ../shared/data/multi30k/)")
    if model is not None and not Path(model, "config.json").is_file():
        return f"no trained model in {model}"
    return None


def load_multi30k(data_dir):
    from datasets import DatasetDict

    from vanilla_transformer.data.corpora import load_parallel_text_files

    if reason := multi30k_missing(data_dir):
        raise FileNotFoundError(reason)
    return DatasetDict({split: load_parallel_text_files(Path(data_dir, f"{name}.en"), Path(data_dir, f"{name}.de"),
                                                        "en", "de")
                        for split, name in (("train", "train"), ("validation", "val"))})
