#!/usr/bin/env bash
# GPU check of vanilla_transformer: attention agreement, the bf16 training step at the paper's batch (base, big;
# ours and MarianMTModel, eager and torch.compile'd: throughput, MFU, peak memory), our loss kernel against
# F.cross_entropy(label_smoothing=) (forward + backward, fp32 and bf16, at the paper batch's shapes: whether to keep it
# on a GPU), `make bench`'s run on the GPU (ours vs MarianMTModel and ours without the key/value cache), and a short
# bf16 training run. Logic: scripts/benchmarks/device_check.py.
#
#   scripts/device_check.sh                 # on a CUDA machine; < 8 minutes; results in $OUT or device_check_out/
#   scripts/device_check.sh --cpu_smoke     # the same code, tiny sizes, on the CPU (about a minute; for tests)
#
# Installs nothing. Python: $PYTHON, else .venv/bin/python when present, else python3. The package is used
# from this checkout (PYTHONPATH), installed or not. When that Python's transformers is missing or older
# than the project's minimum (5.23), wheels carried in $VT_WHEELS (default .whl/, git-ignored) are unpacked
# into a temporary folder that goes first on PYTHONPATH for this run only; nothing is installed. Prepare them
# on a machine with internet access (the GPU machine's Python version, here 3.12):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
# Without CUDA (and without --cpu_smoke) it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then
    py="$PYTHON"
elif [[ -x .venv/bin/python ]]; then
    py=.venv/bin/python
else
    py=python3
fi
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "device_check: $py cannot import torch; set PYTHON to an interpreter with PyTorch." >&2
    exit 2
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

transformers_ok() {
    "$py" - <<'EOF' 2>/dev/null
import sys
from packaging.version import Version
import transformers
sys.exit(0 if Version(transformers.__version__) >= Version("5.23") else 1)
EOF
}

wheels="${VT_WHEELS:-.whl}"
if ! transformers_ok || [[ "${VT_FORCE_WHEELS:-0}" == 1 ]]; then
    shopt -s nullglob
    found=("$wheels"/*.whl)
    shopt -u nullglob
    if (( ${#found[@]} == 0 )); then
        have=$("$py" -c "import transformers; print(transformers.__version__)" 2>/dev/null || echo "none")
        echo "device_check: transformers $have here, the project needs >= 5.23, and no wheels in $wheels/." >&2
        echo "  Carry them (see the comment at the top of scripts/device_check.sh) or set PYTHON." >&2
        exit 2
    fi
    site="$(mktemp -d "${TMPDIR:-/tmp}/vt_device_check_site.XXXXXX")"
    trap 'rm -rf "$site"' EXIT
    "$py" - "$site" "${found[@]}" <<'EOF'
import sys
import zipfile
site, wheels = sys.argv[1], sys.argv[2:]
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
print("device_check: using carried wheels: " + ", ".join(w.rsplit("/", 1)[-1] for w in wheels))
EOF
    export PYTHONPATH="$site:$PYTHONPATH"
    if ! transformers_ok; then
        echo "device_check: the carried wheels did not provide transformers >= 5.23." >&2
        exit 2
    fi
fi

# Hard stop well inside the 8-minute budget (the Python side also skips sections past --budget_s).
status=0
timeout --signal=TERM --kill-after=10 470 "$py" -m scripts.benchmarks.device_check "$@" || status=$?
if (( status == 124 )); then
    echo "device_check: stopped after 470 s." >&2
fi
exit "$status"
