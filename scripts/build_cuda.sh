#!/usr/bin/env bash
# Build ncclean with CUDA on a machine that has neither a GPU nor a CUDA
# toolkit: the toolkit comes from the Python package registry.
#
#   bash scripts/build_cuda.sh [--compute-cap 90] [--check] [--debug]
#
#   --compute-cap N  GPU generation the kernels are compiled for (90 = H100/H200,
#                    80 = A100, 89 = L4/RTX 40xx); default 90.
#   --check          `cargo check --features cuda` only (what CI runs): proves the
#                    CUDA build compiles, links nothing, needs no runtime wheels.
#   --debug          build the dev profile instead of --release (dependencies are
#                    optimised either way; used to test this script cheaply).
#
# What it does:
#   1. pip-installs the CUDA 13.0 compiler wheels (nvidia-cuda-nvcc, -runtime,
#      -crt, -cccl, nvidia-nvvm) into target/cuda-toolkit/site and points
#      CUDA_HOME/PATH at them (the cu12 nvcc wheel lacks the nvcc driver).
#   2. Copies cudarc from cargo's registry into target/cuda-toolkit/cudarc and
#      patches its build script: candle 0.11 asks cudarc for `dynamic-linking`
#      (libcuda, cuBLAS, cuBLASLt, cuRAND, NVRTC as DT_NEEDED at link time, so
#      the binary would not even start without a driver); the patched copy
#      loads them with dlopen at run time instead. The patch is applied with
#      `cargo --config patch.crates-io.cudarc.path=...` for this build only;
#      Cargo.lock is restored afterwards.
#   3. candle-kernels links its GGUF/MoE kernels against the CUDA runtime
#      (`-lcudart`); a linker script named libcudart.so links the runtime
#      statically (libcudart_static.a from nvidia-cuda-runtime), so the binary
#      has no CUDA library among its DT_NEEDED entries at all.
#   4. Builds into target/cuda (release, or debug with --debug) and, unless
#      --check, copies cuBLAS, cuBLASLt, cuRAND and NVRTC (nvidia-cublas,
#      nvidia-curand, nvidia-cuda-nvrtc wheels, ~0.8 GB, mostly cuBLASLt) to
#      cuda-libs/ next to the binary, which it strips. The binary finds cuda-libs/
#      beside itself, else $NCCLEAN_CUDA_LIBS, else the nvidia/*/lib folders of
#      the Python environment on PATH (PyTorch's wheels; src/runtime/cuda_libs.rs), so
#      copying the binary together with cuda-libs/ is enough; the machine
#      that runs it needs only the NVIDIA driver (libcuda.so.1, driver >= 580
#      for CUDA 13). Without a driver the binary still starts: --device auto
#      runs on the CPU and says why, --device cuda exits 2 naming what is missing.
#
# Exit status: 0 built (or checked); 3 the package registry cannot be reached
# (CI skips with a message then); anything else is a build failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

cap=90 mode=build profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --compute-cap) cap=${2:?--compute-cap needs a value}; shift 2 ;;
    --compute-cap=*) cap=${1#*=}; shift ;;
    --check) mode=check; shift ;;
    --debug) profile=debug; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_cuda.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$cap" in ''|*[!0-9]*) echo "build_cuda.sh: --compute-cap must be a number like 90, got $cap" >&2; exit 2 ;; esac

prefix=${NCCLEAN_CUDA_PREFIX:-$root/target/cuda-toolkit}
site=$prefix/site
compiler_wheels=('nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-crt==13.0.*'
                 'nvidia-cuda-cccl==13.0.*' 'nvidia-nvvm==13.0.*')
runtime_wheels=('nvidia-cublas==13.0.*' 'nvidia-curand==10.4.0.*' 'nvidia-cuda-nvrtc==13.0.*')

pip_install() { # target dir, wheels...
  local target=$1; shift
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" "$@"
}

# 1. The toolkit (skipped when an earlier run installed it).
if [ ! -x "$site/nvidia/cu13/bin/nvcc" ]; then
  echo "installing the CUDA 13.0 compiler wheels into $site"
  if ! pip_install "$site" "${compiler_wheels[@]}"; then
    echo "build_cuda.sh: could not install the CUDA wheels from the package registry" >&2
    exit 3
  fi
fi
export CUDA_HOME=$site/nvidia/cu13
export CUDA_PATH=$CUDA_HOME
export PATH=$CUDA_HOME/bin:$PATH
export CUDA_COMPUTE_CAP=$cap
nvcc --version | tail -n 2

# 2. cudarc, loading the CUDA libraries at run time.
cudarc_version=$(awk '/^name = "cudarc"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
[ -n "$cudarc_version" ] || { echo "build_cuda.sh: cudarc is not in Cargo.lock" >&2; exit 1; }
cudarc_src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$cudarc_version" 2>/dev/null | head -n 1 || true)
if [ -z "$cudarc_src" ]; then
  cargo fetch --quiet
  cudarc_src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$cudarc_version" | head -n 1)
fi
cudarc=$prefix/cudarc-$cudarc_version
if [ ! -f "$cudarc/.ncclean-patched" ]; then
  rm -rf "$cudarc"
  cp -r "$cudarc_src" "$cudarc"
  python3 - "$cudarc/build.rs" <<'EOF'
import sys
path = sys.argv[1]
src = open(path).read()
old = '    #[cfg(feature = "dynamic-linking")]\n    dynamic_linking(major, minor);\n'
new = ('    // ncclean (scripts/build_cuda.sh): load the CUDA libraries at run time\n'
       '    // although candle asks for dynamic-linking, so that a CUDA binary starts\n'
       '    // on a machine without a driver and can say what is missing.\n'
       '    #[cfg(feature = "dynamic-linking")]\n'
       '    println!("cargo:rustc-cfg=feature=\\"dynamic-loading\\"");\n')
if src.count(old) != 1:
    sys.exit("build_cuda.sh: cudarc's build.rs changed; update the patch in scripts/build_cuda.sh")
open(path, "w").write(src.replace(old, new))
EOF
  touch "$cudarc/.ncclean-patched"
fi

# 3. -lcudart resolves to the static runtime.
link=$prefix/link
mkdir -p "$link"
printf 'INPUT(%s -ldl -lrt -lpthread)\n' "$CUDA_HOME/lib/libcudart_static.a" > "$link/libcudart.so"

# 4. Build. Check and build use the same flags, so the kernels nvcc compiled
# for one are reused by the other.
export CARGO_TARGET_DIR=$root/target/cuda
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$link -C link-arg=-Wl,-rpath,\$ORIGIN/cuda-libs"
cp Cargo.lock "$prefix/Cargo.lock.orig"
trap 'cp "$prefix/Cargo.lock.orig" "$root/Cargo.lock"' EXIT
cargo_args=(--features cuda --config "patch.crates-io.cudarc.path=\"$cudarc\"")
start=$(date +%s)
if [ "$mode" = check ]; then
  cargo check --workspace --all-targets "${cargo_args[@]}"
  echo "cargo check --features cuda passed in $(( $(date +%s) - start ))s (compute capability $cap)"
  exit 0
fi
if [ "$profile" = release ]; then
  cargo build --release --bin ncclean "${cargo_args[@]}"
else
  cargo build --bin ncclean "${cargo_args[@]}"
fi
bin=$CARGO_TARGET_DIR/$profile/ncclean
echo "built in $(( $(date +%s) - start ))s"
# Stripped, so it travels in the 64 MiB a lent GPU machine accepts
# (scripts/device_check.sh).
if [ "$profile" = release ] && command -v strip >/dev/null 2>&1; then
  strip "$bin"
fi
echo "binary size: $(du -h "$bin" | cut -f1)"

# 5. The libraries the binary loads at run time, next to it.
# (A separate pip target: pip --target skips packages whose top-level
# directory, nvidia/, already exists there.)
libs=$(dirname "$bin")/cuda-libs
runtime=$prefix/runtime
if [ ! -f "$runtime/nvidia/cu13/lib/libcublasLt.so.13" ]; then
  echo "installing cuBLAS, cuRAND and NVRTC (runtime wheels) into $runtime"
  rm -rf "$runtime"
  pip_install "$runtime" "${runtime_wheels[@]}" || { echo "build_cuda.sh: could not install the runtime wheels" >&2; exit 3; }
fi
mkdir -p "$libs"
for f in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libnvrtc-builtins.so.13.0; do
  cp -u "$runtime/nvidia/cu13/lib/$f" "$libs/"
done
echo
echo "binary:    $bin"
echo "libraries: $libs ($(du -sh "$libs" | cut -f1); found through the binary's RUNPATH)"
echo "Copy both to the GPU machine (it needs only the NVIDIA driver), or only the binary where"
echo "PyTorch's CUDA 13 wheels are in the Python environment on PATH, then e.g.:"
echo "  $bin fit DATA --out-dir RUN            # --device auto picks cuda:0"
echo "  bash scripts/gpu_check.sh $bin         # parity, throughput, training speed"
echo "  bash scripts/device_check.sh OUT           # the same, with PyTorch side by side"
echo "If the libraries are moved elsewhere: export NCCLEAN_CUDA_LIBS=/new/place/cuda-libs"
