#!/usr/bin/env bash
# The paper's base model on WMT14 English→German, data to BLEU, on every GPU accelerate is configured for:
#   scripts/recipes/wmt14_en_de_base.sh [--data_dir DIR] [train.py flags, e.g. --bf16 --torch_compile]
# Machines and processes come from accelerate's config (accelerate config, or ACCELERATE_ARGS="--num_processes 8").
set -euo pipefail
cd "$(dirname "$0")/../.."
exec accelerate launch ${ACCELERATE_ARGS:-} scripts/recipes/wmt14_en_de.py --model base "$@"
