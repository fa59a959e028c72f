#!/usr/bin/env bash
# Decode the three MobileNetV2 reference images with libjpeg-turbo (djpeg),
# the decoder that produced ../shared/models/mobilenet_v2/reference.json, so
# the exact reference test can check the network itself to 1e-3. (The image
# crate's JPEG decoder differs by a few grey levels; the end-to-end test
# checks that path with looser tolerances.)
# Usage: scripts/reference_ppms.sh OUT_DIR   (installs libjpeg-turbo-progs if needed)
set -euo pipefail
out=${1:?usage: reference_ppms.sh OUT_DIR}
shared=${NCCLEAN_SHARED:-$(dirname "$0")/../../shared}
ref="$shared/models/mobilenet_v2/reference.json"
[ -f "$ref" ] || { echo "no $ref: nothing to decode" >&2; exit 1; }
if ! command -v djpeg >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq libjpeg-turbo-progs || { apt-get update -qq && apt-get install -y -qq libjpeg-turbo-progs; }) >/dev/null
  else
    echo "djpeg not found: apt-get install libjpeg-turbo-progs" >&2; exit 1
  fi
fi
mkdir -p "$out"
for name in $(python3 -c 'import json,sys; print(" ".join(r["image"] for r in json.load(open(sys.argv[1]))["references"]))' "$ref"); do
  djpeg -pnm "$shared/data/flickr8k/images/$name" > "$out/${name%.jpg}.ppm"
done
echo "$out"
