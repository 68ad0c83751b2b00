"""What every measurement here shares: one timer, one matmul peak, one environment report, one subprocess
environment, one table and one report writer, and the Multi30k data that the quality and batching runs read.

The modules beside this file import it relatively (`from .toolkit import ...`): `scripts.benchmarks` is a package,
run from the repository root as `python -m scripts.benchmarks.NAME`.
"""

from __future__ import annotations

import gc
import json
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

from vanilla_transformer.data.corpora import available_cores

# The code each kind of measurement exercises (`environment(measures=...)`): the model's three files, and the engines.
MODEL_CODE = ("vanilla_transformer/configuration_vanilla_transformer.py",
              "vanilla_transformer/modeling_vanilla_transformer.py", "vanilla_transformer/support_vanilla_transformer.py")
ENGINE_CODE = (*MODEL_CODE, "vanilla_transformer/tools/translation.py", "vanilla_transformer/tools/engines.py",
               "vanilla_transformer/tools/exports.py", "vanilla_transformer/tools/ctranslate2.py",
               "vanilla_transformer/tools/onnx")


def synchronize(device: torch.device | str | None) -> None:
    """Wait for the device's queued kernels (GPU timings are otherwise only the launch)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(tasks: dict[str, Callable], repeats: int, warmup: int = 1,
                     device: torch.device | str | None = None) -> dict[str, list[float]]:
    """Seconds per call of each task. Every repetition runs every task once; the order alternates between
    repetitions so that neither slot (first, or right after a competitor) favours one system. On a GPU each
    call is waited for."""
    names = list(tasks)
    times = {name: [] for name in names}
    for rep in range(warmup + repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            gc.collect()
            synchronize(device)
            start = time.perf_counter()
            tasks[name]()
            synchronize(device)
            if rep >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def matmul_peak(size: int, repeats: int = 5, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> dict:
    """The practical matmul peak of the machine at hand: (size x size) @ (size x size), best and median of
    `repeats`, in FLOP/s. The denominator of model-FLOPs utilisation."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = time_interleaved({"mm": lambda: torch.mm(a, b)}, repeats, warmup=2, device=device)["mm"]
    flops = 2 * size**3
    return {"size": size, "dtype": str(dtype).removeprefix("torch."), "flops": flops / min(times),
            "median_flops": flops / statistics.median(times)}


def load_average() -> list[float] | None:
    """Other processes on the cores inflate and scatter the times: a run records how busy the machine was."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def format_load(load: list[float] | None) -> str:
    """A recorded load average (1/5/15 min) as a report prints it; "–" where the platform has none."""
    return "/".join(f"{value:.1f}" for value in load) if load else "–"


# The instruction sets that decide how fast bf16 and int8 run on a CPU: engine speed-ups differ by them.
CPU_FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")


def cpu_description() -> tuple[str, list[str]]:
    """The processor's model name and which of `CPU_FLAGS_THAT_MATTER` it has (Linux; elsewhere the platform's name
    and no flags)."""
    cpu, flags = platform.processor() or platform.machine(), []
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return cpu, flags
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    present = set(fields.get("flags", "").split())
    return fields.get("model name", cpu), [flag for flag in CPU_FLAGS_THAT_MATTER if flag in present]


def describe_cpu(environment: dict) -> str:
    """The processor as a report names it: model and the flags that matter, e.g. "AMD EPYC (avx2, avx512f)"."""
    flags = environment.get("cpu_flags")
    if flags is None:  # recorded before the flags were
        return environment["cpu"]
    return f"{environment['cpu']} ({', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS_THAT_MATTER)})"


def cpu_slug(environment: dict) -> str:
    """A file-name part naming the CPU a report was measured on, e.g. "intel_xeon" or "amd_epyc"."""
    words = [word for word in environment["cpu"].replace("(R)", "").split() if word.isalpha()]
    return "_".join(words[:2]).lower() or "cpu"


def git_commit() -> str | None:
    """The commit the measured code is at, with "+" when the work tree had changes; None outside a clone."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=7", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def environment(device: torch.device | str | None = None, measures: tuple[str, ...] = ()) -> dict:
    """Versions, commit and the code measured (`measures`: the repository paths whose change after this commit makes
    the figures stale, as scripts/utils/pages.py checks), processor (and the flags that set its bf16 and int8 speed)
    or GPU, threads and how busy the machine was: what a reader needs to trust a time."""
    cpu, cpu_flags = cpu_description()
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda_build": torch.version.cuda,
            "transformers": transformers.__version__, "commit": git_commit(), "measures": list(measures),
            "cpu": cpu, "cpu_flags": cpu_flags,
            "cores_available": available_cores(),
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
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


def markdown_table(header: list[str], rows: list[list]) -> list[str]:
    """A markdown table's lines. Cells are written with str(); a `|` inside a cell (as in `|Y|^alpha`) is escaped,
    so that it cannot split the cell."""
    def line(cells):
        return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"

    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a table row has {len(row)} cells for {len(header)} columns: {row!r}")
    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that ran `python -m scripts.benchmarks.<module>`, as a report quotes it."""
    return shlex.join(["python", "-m", f"scripts.benchmarks.{module}", *(sys.argv[1:] if argv is None else argv)])


def write_report(stem: str | Path, results: dict, markdown: str) -> dict[str, Path]:
    """`stem`.json (every number) and `stem`.md (the report a person reads)."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {"json": stem.with_name(stem.name + ".json"), "md": stem.with_name(stem.name + ".md")}
    paths["json"].write_text(json.dumps(results, indent=2, default=str) + "\n")
    paths["md"].write_text(markdown)
    return paths


def multi30k_missing(data_dir) -> str | None:
    """Why Multi30k cannot be used from `data_dir`, or None when train and val are both there."""
    missing = [name for name in ("train.en", "train.de", "val.en", "val.de") if not Path(data_dir, name).is_file()]
    if missing:
        return (f"Multi30k not found: {', '.join(missing)} missing in {Path(data_dir).resolve()} (it is research-use "
                f"data kept outside the repository, at ../shared/data/multi30k/)")
    return None


def load_multi30k(data_dir, source_lang: str = "en", target_lang: str = "de"):
    from datasets import DatasetDict

    from vanilla_transformer.data.corpora import load_parallel_text_files

    reason = multi30k_missing(data_dir)
    if reason:
        raise FileNotFoundError(reason)

    def split(name):
        source, target = (Path(data_dir, f"{name}.{lang}") for lang in (source_lang, target_lang))
        return load_parallel_text_files(source, target, source_lang, target_lang)

    return DatasetDict({"train": split("train"), "validation": split("val")})


def shared_tokenizer_for(raw, vocab_size: int, max_length: int = 128):
    """The shared BPE of `scripts/train.py`, trained on both sides of the training split."""
    from vanilla_transformer.data.tokenization import train_shared_tokenizer

    texts = [pair[lang] for pair in raw["train"]["translation"] for lang in pair]
    return train_shared_tokenizer(texts, vocab_size=vocab_size, model_max_length=max_length, show_progress=False)
