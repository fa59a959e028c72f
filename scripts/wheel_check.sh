#!/usr/bin/env bash
# Build ncclean's wheel (pyproject.toml: maturin, bindings = "bin") the way
# `pip install .` does, but from the dev build `cargo test` leaves in target/
# (nothing is compiled again), install it into a fresh virtual environment, and run
# `ncclean --version` and the demo loop (examples/quickstart.sh) with the
# binary the wheel put on PATH. CI runs it after the tests.
# Usage: bash scripts/wheel_check.sh [WORK_DIR] [PAIRS]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
work=${1:-target/wheel-check}
pairs=${2:-300}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
# maturin comes from PyPI as a wheel with its binary; a venv of its own
# keeps it out of the environment the wheel is tested in.
python3 -m venv "$work/build-env"
# Exit 3: PyPI could not be reached for maturin (CI skips loudly).
if ! "$work/build-env/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.5,<2'; then
  echo "maturin could not be installed from PyPI" >&2
  exit 3
fi
# pip's own build of the checkout (the PEP 517 path `pip install .` takes),
# told to use the dev profile: MATURIN_PEP517_ARGS reaches maturin.
PATH="$work/build-env/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
  "$work/build-env/bin/pip" wheel . --quiet \
  --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir "$work/wheels"
echo "wheel built: $(ls "$work"/wheels) after $(( $(date +%s) - start ))s"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work"/wheels/ncclean-*.whl
export PATH="$work/venv/bin:$PATH"
installed=$(command -v ncclean)
if [ "$installed" != "$work/venv/bin/ncclean" ]; then
  echo "the wheel did not put ncclean on the venv's PATH (found: ${installed:-nothing})" >&2
  exit 1
fi
ncclean --version
ncclean --version --json
NCCLEAN="$installed" bash examples/quickstart.sh "$work/demo" "$pairs"
echo "wheel check: $(( $(date +%s) - start ))s"
