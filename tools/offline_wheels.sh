#!/usr/bin/env bash
# Wheels a GPU machine without access to a package index lacks for `nox --no-venv -s test-cuda`
# (nox, xgrammar, the [serve] and [test] extras' packages), for Python 3.12, into .whl/ (ignored by
# git, ~20 MB). Copy .whl/ to that machine with the checkout; `bash benchmarks/gpu_session.sh nox_cuda`
# there installs them into /tmp/site and runs the session.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl \
  nox==2026.10.20 fastapi==0.165.0 uvicorn==0.54.0 openai==3.57.0 pyzmq==27.3.0 dockerfile-parse==2.0.1 jsonschema
# xgrammar's and gguf's other requirements (torch, transformers, triton, numpy, pydantic, pyyaml) are already there.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --no-deps \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl \
  xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 gguf==0.19.0
du -sh .whl
