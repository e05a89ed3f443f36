#!/usr/bin/env bash
# Runs on the GPU machine: restores .device-run/ from a pack that scripts/device-prepare.sh made
# (.device-pack/run.txz unless PACK names another, e.g. an older build kept beside it), and names
# the commit it was built from. .device-run/.unpacked records which pack it holds.
# usage: device-unpack.sh [--if-needed] [PACK]
#   --if-needed  leave .device-run alone when it already holds PACK, unpacked after PACK was made
set -euo pipefail
cd "$(dirname "$0")/.."
if_needed=false
[ "${1:-}" = --if-needed ] && { if_needed=true; shift; }
pack=${1:-.device-pack/run.txz}
if $if_needed && [ .device-run/.unpacked -nt "$pack" ] && [ "$(cat .device-run/.unpacked)" = "$pack" ]; then
  exit 0
fi
rm -rf .device-run
if command -v xz > /dev/null; then
  xz -dc "$pack" | tar xf -
else
  python3 -c 'import lzma, sys, shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' \
    "$pack" | tar xf -
fi
echo "$pack" > .device-run/.unpacked
echo "unpacked .device-run from $pack, built from $(cat .device-run/COMMIT)"
