#!/usr/bin/env bash
# Prepare a real vLLM install for kvsim's lockstep validation (sim/vllm_real), CPU only.
#
#   bash scripts/setup_vllm.sh                 # 0.5.4 and 0.11.0
#   bash scripts/setup_vllm.sh 0.5.4           # one version
#   bash scripts/setup_vllm.sh 0.33.0          # the third pin (not in the default set: ~500 MB)
#   bash scripts/setup_vllm.sh 0.19.1 0.20.0 0.25.1 0.26.0   # the 2026-bug pins (~250-430 MB each)
#   VLLM_WHEEL_DIR=/path/to/wheels bash scripts/setup_vllm.sh 0.11.0
#
# For each version V this makes .vllm/V/ (git-ignored):
#   .vllm/V/vllm/                 the wheel, installed with --no-deps (nothing built from source)
#   .vllm/V/_deps/                (V >= 0.10) pinned pure-Python packages its V1-engine modules import
# and deletes the wheel's compiled CUDA extensions (*.so): on a CPU-only torch they crash at
# import, and without them vLLM falls back to Python and only logs a warning.
# torch itself is not installed here: the project venv already has it (CPU build).
#
# A local wheel is used when VLLM_WHEEL_DIR is set and one is found in $VLLM_WHEEL_DIR/V/ or
# $VLLM_WHEEL_DIR/; otherwise (the default) pip downloads vllm==V from the package index.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
WHEEL_DIR="${VLLM_WHEEL_DIR:-}"
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(0.5.4 0.11.0)

# Pure-Python (or wheel-only) packages the 0.10/0.11 `vllm.v1.core` + `vllm.v1.request` import
# chain needs, found by importing until it succeeds; pinned to releases contemporary with 0.11.0.
DEPS_V1_ENGINE=(
  aiohappyeyeballs==2.6.1 aiohttp==3.12.15 aiosignal==1.4.0 anyio==4.11.0 blake3==1.0.7
  cachetools==6.2.0 cbor2==5.7.0 certifi==2025.8.3 charset-normalizer==3.4.3 diskcache==5.6.3
  distro==1.9.0 fastapi==0.118.0 frozenlist==1.7.0 h11==0.16.0 httpcore==1.0.9 httpx==0.28.1
  huggingface_hub==0.35.3 idna==3.10 jiter==0.11.0 msgspec==0.19.0 multidict==6.6.4
  openai==1.109.1 openai-harmony==0.0.4 prometheus_client==0.23.1 propcache==0.3.2
  py-cpuinfo==9.0.0 pybase64==1.4.2 regex==2025.9.18 requests==2.32.5 safetensors==0.6.2
  setproctitle==1.3.7 sniffio==1.3.1 starlette==0.48.0 tokenizers==0.22.1 tqdm==4.67.1
  transformers==4.56.2 urllib3==2.5.0 yarl==1.20.1
)

# The same for 0.33.0, found the same way. Its wheel metadata asks for torch==2.14.0, but the
# three modules kvsim imports run on the venv's torch 2.13 (no torch >= 2.14 API on that path).
# Versions honour 0.33.0's own Requires-Dist bounds (transformers>=5.16.1,<5.21, xgrammar==0.2.8,
# apache-tvm-ffi==0.1.11, llguidance<1.8, ...). vllm/v1/request.py reaches xgrammar and
# llguidance through vllm.v1.structured_output -> vllm.parser.
DEPS_V1_ENGINE_0_33=(
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 anyio==4.16.0 apache-tvm-ffi==0.1.11
  blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3
  diskcache==5.6.3 distro==1.9.0 fastapi==0.136.3 frozenlist==1.8.0 h11==0.16.0 httpcore==1.0.9
  httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 jiter==0.19.0
  llguidance==1.7.6 msgspec==0.23.0 multidict==7.2.1 openai==3.57.0 openai-harmony==0.0.8
  partial-json-parser==0.2.1.1.post7 prometheus_client==0.26.0 propcache==0.5.4 py-cpuinfo==9.0.0
  pybase64==1.5.1 regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 setproctitle==1.3.8
  sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.20.2
  truststore==0.10.5 urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1
)

# 0.19.1 to 0.26.0 (the releases where the 2026 admission bugs live) import on 0.33.0's set plus
# these, found the same way (0.19.x's vllm.v1.request reaches gguf through transformers_utils).
DEPS_V1_ENGINE_0_2X=(gguf==0.19.0)

install_one() {
  local version="$1" target="$REPO/.vllm/$1" wheel=""
  if [ -n "$WHEEL_DIR" ]; then
    for cand in "$WHEEL_DIR/$version"/vllm-"$version"-*.whl "$WHEEL_DIR"/vllm-"$version"-*.whl; do
      [ -f "$cand" ] && { wheel="$cand"; break; }
    done
  fi
  echo "== vLLM $version -> $target (${wheel:-download vllm==$version})"
  rm -rf "$target"
  "$PY" -m pip install --quiet --no-deps --target "$target" "${wheel:-vllm==$version}"
  find "$target/vllm" -name '*.so' -delete
  case "$version" in
    0.5.*|0.6.*) ;;  # v0 block managers need only numpy, psutil, typing_extensions and torch
    0.19.*|0.2[0-9].*) "$PY" -m pip install --quiet --no-deps --target "$target/_deps" "${DEPS_V1_ENGINE_0_33[@]}" "${DEPS_V1_ENGINE_0_2X[@]}" ;;
    0.33.*) "$PY" -m pip install --quiet --no-deps --target "$target/_deps" "${DEPS_V1_ENGINE_0_33[@]}" ;;
    *) "$PY" -m pip install --quiet --no-deps --target "$target/_deps" "${DEPS_V1_ENGINE[@]}" ;;
  esac
  "$PY" - "$target" "$version" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1].rsplit("/.vllm/", 1)[0])
from sim.vllm_real.loader import import_vllm, load_vllm, version_tuple
inst = load_vllm(sys.argv[1])
mods = ["core.block_manager_v1", "core.block_manager_v2"] if version_tuple(inst.version) < (0, 10) \
    else ["v1.core.kv_cache_manager", "v1.request", "v1.core.sched.scheduler"]
for m in mods:
    import_vllm(m, inst)
print(f"   ok: vLLM {inst.version} imports {', '.join(mods)}")
EOF
}

for v in "${VERSIONS[@]}"; do install_one "$v"; done
