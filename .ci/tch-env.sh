# shellcheck shell=bash
# Source this file (`. .ci/tch-env.sh`) to build and run memzoo's `tch` (LibTorch) backend on the
# CPU without downloading LibTorch at build time.
#
# What it does, once per machine (a kept machine reuses everything, nothing is downloaded again):
# 1. A venv OUTSIDE the clone, $MEMZOO_TORCH_HOME/venv (default ~/.cache/memzoo-torch), with
#    PyPI's `torch==2.9.0` (the version tch 0.22 expects) installed with `--no-deps`, plus the two
#    small CUDA wheels that libtorch_cpu.so itself links against (cudart, cupti: ~11 MB). The
#    CUDA wheel's other nvidia-* dependencies (cuBLAS, cuDNN, NCCL, ...: several GB) are skipped.
# 2. A CPU view of that wheel, $MEMZOO_TORCH_HOME/libtorch/{include,lib}: links to the CPU
#    libraries only and an empty `libtorch.so` (in the wheel, libtorch.so is a shim that pulls in
#    libtorch_cuda.so). torch-sys then links the CPU libraries only; no Python runs at build time.
# 3. Exports LIBTORCH (read by torch-sys and burn-tch), LIBTORCH_CXX11_ABI=1 (the PyPI wheels use
#    the C++11 ABI) and LD_LIBRARY_PATH (needed at run time: the test binary has no rpath).
#
# The result runs LibTorch on the CPU (`tch`); `tch-cuda` needs the full wheel with its nvidia
# dependencies and `LIBTORCH_USE_PYTORCH=1` instead (see README, Backends).
#
# Returns non-zero (and prints why) if something could not be installed; the caller decides.

memzoo_tch_env() {
  local home="${MEMZOO_TORCH_HOME:-$HOME/.cache/memzoo-torch}"
  local version="2.9.0"
  local venv="$home/venv"
  local py="${MEMZOO_PYTHON:-python3}"
  local site torch_dir view

  if [ ! -x "$venv/bin/python" ]; then
    echo "tch-env: creating $venv"
    "$py" -m venv "$venv" || { echo "tch-env: '$py -m venv' failed" >&2; return 1; }
  fi
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  torch_dir="$site/torch"
  if [ ! -f "$site/torch-$version.dist-info/METADATA" ] || [ ! -f "$torch_dir/lib/libtorch_cpu.so" ]; then
    local t0
    t0=$(date +%s)
    echo "tch-env: installing torch==$version (no nvidia-* dependencies) into $venv"
    "$venv/bin/pip" install --quiet --no-deps "torch==$version" \
      "nvidia-cuda-runtime-cu12==12.8.90" "nvidia-cuda-cupti-cu12==12.8.90" ||
      { echo "tch-env: pip install torch==$version failed" >&2; return 1; }
    echo "tch-env: pip took $(( $(date +%s) - t0 )) s; venv is $(du -sh "$venv" | cut -f1)"
  fi
  # pip may not have installed the CUDA runtime wheels if an older run was interrupted.
  local cudart="$site/nvidia/cuda_runtime/lib/libcudart.so.12"
  local cupti="$site/nvidia/cuda_cupti/lib/libcupti.so.12"
  if [ ! -f "$cudart" ] || [ ! -f "$cupti" ]; then
    "$venv/bin/pip" install --quiet --no-deps "nvidia-cuda-runtime-cu12==12.8.90" \
      "nvidia-cuda-cupti-cu12==12.8.90" ||
      { echo "tch-env: pip install of the CUDA runtime wheels failed" >&2; return 1; }
  fi

  view="$home/libtorch"
  if [ ! -f "$view/lib/libtorch.so" ] || [ ! -f "$view/build-version" ] ||
     [ "$(cat "$view/build-version")" != "$version" ]; then
    echo "tch-env: writing the CPU view $view"
    rm -rf "$view"
    mkdir -p "$view/lib"
    ln -s "$torch_dir/include" "$view/include"
    local f
    for f in libc10.so libtorch_cpu.so libgomp.so.1 libshm.so; do
      ln -s "$torch_dir/lib/$f" "$view/lib/$f"
    done
    ln -s "$cudart" "$view/lib/libcudart.so.12"
    ln -s "$cupti" "$view/lib/libcupti.so.12"
    # torch-sys always links `-ltorch`; an empty library stands in for the CUDA shim.
    printf '' | ${CC:-cc} -shared -x c - -o "$view/lib/libtorch.so" ||
      { echo "tch-env: could not build the empty libtorch.so (need a C compiler)" >&2; return 1; }
    echo "$version" >"$view/build-version"
  fi

  export LIBTORCH="$view"
  export LIBTORCH_CXX11_ABI=1
  unset LIBTORCH_USE_PYTORCH LIBTORCH_LIB LIBTORCH_INCLUDE
  export LD_LIBRARY_PATH="$view/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "tch-env: LIBTORCH=$LIBTORCH"
}

memzoo_tch_env
