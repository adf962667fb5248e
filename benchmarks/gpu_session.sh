#!/usr/bin/env bash
# One bundled run on an NVIDIA GPU machine: correctness first, then the benchmarks, each step
# under a share of one overall deadline so the most important results always come back.
#   OUT=/some/dir DEADLINE_S=570 bash benchmarks/gpu_session.sh [steps...]
# Steps (default: all, in this order): env pytest_kernels octavo_llama8b hf_llama8b
#   pytest_engine octavo_qwen05b hf_qwen05b kernels hfbatch_llama8b hfbatch_qwen05b
#   (pytest_llama: the engine tests of the llama fixture and memory profiling only;
#    async_llama8b: batch-1 TPOT with async scheduling on vs off, bandwidth in the same process;
#    pytest_moe, moe: the mixture-of-experts GPU tests and the Qwen3-30B-A3B-shape benchmark;
#    moe_decode, pytest_moe_gemv: the experts' small-batch GEMV path against the grouped GEMM at
#    1-16 tokens, batch-1 TPOT and device step with it on/off, then its GPU tests;
#    moe_profile, pytest_moe_fusions: the batch-1 step's fusions on/off (device step, TPOT,
#    kernel by kernel), then the GPU tests of the fused kernels and the MoE models)
set -u
OUT=${OUT:-/tmp/octavo-gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OCTAVO_LOGGING_LEVEL=INFO TOKENIZERS_PARALLELISM=false
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-570}
B="python3 benchmarks/bench_cuda.py"

run() {  # run LIMIT_S LOGFILE CMD...: bounded by the step limit and what is left overall
  local lim=$1 log=$2
  shift 2
  local left=$((DEADLINE_S - ($(date +%s) - START)))
  [ "$left" -lt "$lim" ] && lim=$left
  if [ "$lim" -le 10 ]; then echo "SKIPPED (deadline): $*" >>"$OUT/$log"; return; fi
  echo "### $(date +%T) [limit ${lim}s] $*" >>"$OUT/$log"
  timeout "$lim" "$@" >>"$OUT/$log" 2>&1
  echo "### rc=$? after $(($(date +%s) - START))s" >>"$OUT/$log"
}

step_env() {
  { nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  } >>"$OUT/env.txt" 2>&1
  run 60 bench.log $B bandwidth
}
step_pytest_kernels() { run 150 pytest.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider tests/attention tests/models/test_fused_ops.py; }
step_pytest_engine() { run 200 pytest.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider -rA tests --deselect tests/attention --deselect tests/models/test_fused_ops.py; }
step_pytest_llama() { run 120 pytest.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider -rA tests/worker tests/platforms/test_conformance_accelerators.py -k "llama or memory_profile or greedy_matches_cpu"; }
step_octavo_llama8b() { run 200 bench.log $B octavo --shape llama8b; }
step_async_llama8b() { run 150 bench.log $B async --shape llama8b; }
# The CUDA nox session as the images run it, on a machine without a package index (run
# `bash tools/offline_wheels.sh` where there is one and copy .whl/ along): common tests +
# cuda-marked tests, C++ CPU kernels built in place.
step_nox_cuda() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$OUT/nox.log" 2>&1 || { echo "wheel install failed" >>"$OUT/nox.log"; return; }
  run 120 nox.log python3 setup.py build_ext --inplace
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH run 400 nox.log python3 -m nox --no-venv -s test-cuda
}
step_octavo_qwen05b() { run 120 bench.log $B octavo --shape qwen05b; }
step_hf_llama8b() { run 100 bench.log $B hf-generate --shape llama8b; }
step_hf_qwen05b() { run 60 bench.log $B hf-generate --shape qwen05b; }
step_kernels() { run 60 bench.log $B kernels; }
step_hfbatch_llama8b() { run 150 bench.log $B hf-generate-batch --shape llama8b; }
step_hfbatch_qwen05b() { run 90 bench.log $B hf-generate-batch --shape qwen05b; }
# Mixture of experts: the MoE kernel/engine GPU tests, then the Qwen3-30B-A3B-shape benchmark
# (grouped kernel vs per-expert loops, batch-1 TPOT vs active-weight roofline, throughput, HF).
step_pytest_moe() { run 120 pytest_moe.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider -rfE tests/models/moe tests/models/test_llama_moe.py; }
step_moe_decode() { run 150 bench_moe.txt python3 benchmarks/bench_moe.py decode --out "$OUT/bench_moe_decode.json" --kernel-timeout 55 --timeout 95; }
step_pytest_moe_gemv() { run 90 pytest_moe.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider -rfE tests/models/moe/test_triton_gemv.py tests/models/test_llama_moe.py; }
step_moe() { run 245 bench_moe.txt python3 benchmarks/bench_moe.py all --out "$OUT/bench_moe.json" --kernel-timeout 40 --timeout 115 --hf-timeout 85; }
step_moe_profile() { run 240 bench_moe_profile.txt python3 benchmarks/bench_moe.py profile; }
step_pytest_moe_fusions() { run 150 pytest_moe.log python3 -m pytest -m cuda -n 8 -q -p no:cacheprovider -rfE tests/models/test_fused_ops.py tests/models/moe/test_triton_router.py tests/models/moe/test_triton_gemv.py tests/models/test_llama_moe.py; }

STEPS=${*:-env pytest_kernels octavo_llama8b hf_llama8b pytest_engine octavo_qwen05b hf_qwen05b kernels hfbatch_llama8b hfbatch_qwen05b}
for s in $STEPS; do "step_$s"; done
if [ -f "$OUT/bench.log" ]; then
  $B summary "$OUT/bench.log" --out "$OUT/results.json" >"$OUT/summary.txt" 2>&1
  cat "$OUT/summary.txt"
  grep -E "^### rc" "$OUT/bench.log"
fi
[ -f "$OUT/pytest.log" ] && grep -E "passed|failed|error" "$OUT/pytest.log" | tail -5
[ -f "$OUT/pytest_moe.log" ] && grep -E "passed|failed|error" "$OUT/pytest_moe.log" | tail -3
[ -f "$OUT/bench_moe.txt" ] && grep -E "^\[(kernel|gemv|octavo)" "$OUT/bench_moe.txt"
[ -f "$OUT/bench_moe_profile.txt" ] && grep -E "device step|TPOT|kernels [0-9]|us  x|rc=" "$OUT/bench_moe_profile.txt" | head -100
[ -f "$OUT/nox.log" ] && grep -E "passed|failed|error|Session|rc=" "$OUT/nox.log" | tail -8
