#!/usr/bin/env bash
# Fine-tuning a Hugging Face model on the pipeline, from a text file to from_pretrained and back:
#
#   bash examples/hf_finetune/run.sh [--quick] [--lora] [WORK]
#
# 1. a byte-pair tokenizer trained on Debian's licence texts (/usr/share/common-licenses);
# 2. a small Llama model (random weights: the "pretrained" model) saved with it by save_pretrained;
# 3. the texts as uint16 token files, every tenth paragraph held out for the test;
# 4. pipetrain fine-tunes it on 2 stages (finetune.json, its paths relative to WORK), logging every
#    step to WORK/metrics.jsonl, and exports the result with `export --format hf`;
# 5. transformers loads the export, computes the test loss (it must equal pipetrain's) and samples.
#
# --lora fine-tunes the same model with LoRA's adapters instead (rank 16 beside every projection,
# every other weight frozen: `model.lora`), exports it merged (--format hf) and as a PEFT adapter
# (--format peft), and checks both: transformers on the merged model and PEFT's model of the
# source with the adapter must each give pipetrain's test loss. It writes no figures: adapters
# beside a model of random weights, its embedding and head frozen, learn little (docs/models.md).
#
# WORK defaults to $TMPDIR/pipetrain-hf-finetune. The full run writes its figures into
# examples/hf_finetune/results/; --quick (the ctest example.hf_finetune) trains a smaller model
# for a few steps and writes none. Exits 77 (skipped) where the project's Python lacks
# transformers or tokenizers. PIPETRAIN names the binary (default: the build's), PIPETRAIN_PYTHON
# the Python (default: scripts/env.sh's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
python=${PIPETRAIN_PYTHON:-$(pipetrain_python)}
pipetrain=${PIPETRAIN:-${PIPETRAIN_BUILD_DIR:-$root/build}/apps/pipetrain}
quick=0
lora=0
if [ "${1:-}" = --quick ]; then quick=1; shift; fi
if [ "${1:-}" = --lora ]; then lora=1; shift; fi
work=${1:-${TMPDIR:-/tmp}/pipetrain-hf-finetune}

if ! "$python" -c 'import transformers, tokenizers' 2>/dev/null; then
  echo "skipped: $python has no transformers or tokenizers (scripts/setup.sh installs them)"
  exit 77
fi
if [ $lora = 1 ] && ! "$python" -c 'import peft' 2>/dev/null; then
  echo "skipped: $python has no peft (scripts/setup.sh installs it)"
  exit 77
fi
[ -x "$pipetrain" ] || { echo "no pipetrain binary at $pipetrain (build it, or set PIPETRAIN)" >&2; exit 1; }
export HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# WORK is emptied first: only a folder this script made (it leaves a mark) or an empty one.
if [ -d "$work" ] && [ -n "$(ls -A "$work")" ] && [ ! -f "$work/.hf_finetune" ]; then
  echo "$work: not empty and not made by this example; give another folder" >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work"
touch "$work/.hf_finetune"
work=$(cd "$work" && pwd)
if [ $quick = 1 ]; then
  prepare=(--vocab 1024 --hidden 64 --layers 2)
  train=(--steps 12 --set train.eval_every=0 --set train.log_every=4)
  check=(--samples 1 --new-tokens 12)
else
  prepare=()
  train=()
  check=(--cpu "$(lscpu | sed -n 's/^Model name: *//p')")
  [ $lora = 1 ] || check+=(--results "$here/results")
fi
if [ $lora = 1 ]; then
  train+=(--set 'model.lora={"rank": 16, "alpha": 32, "targets": "all"}')
  check+=(--peft "$work/adapter")
fi

"$python" "$here/hf_finetune.py" prepare "$work" "${prepare[@]}"
cd "$work"
"$pipetrain" train "$here/finetune.json" --metrics metrics.jsonl "${train[@]}" 2>&1 | tee train.log
"$pipetrain" export checkpoints exported --format hf
if [ $lora = 1 ]; then "$pipetrain" export checkpoints adapter --format peft; fi
"$python" "$here/hf_finetune.py" check "$work" "${check[@]}"
