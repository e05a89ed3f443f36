#!/usr/bin/env bash
# Builds, on this machine, what one `ab-session.sh` device call needs to time a stack of kernel
# patches (docs/pending/*.patch) build by build: HEAD's CLI as A, HEAD + the first patch as
# `c`, + the second as `d`, …, each packed as .device-pack/flash-attn-<letter>.xz, and HEAD + every
# patch through scripts/device-prepare.sh as B (the test binaries). Then it puts the tree back to
# HEAD (it refuses to start on a tree with uncommitted changes) and prints the STACK= to pass.
#   scripts/stack-prepare.sh docs/pending/a.patch docs/pending/b.patch
#   → STACK="c" (A → c = HEAD + a → B = HEAD + a + b)
# Each patch but the last costs a `regen-ptx.sh` and a release build of the CLI; the last one a
# `regen-ptx.sh` and `device-prepare.sh` (about 4 + 3 + 8 minutes on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."
letters=(c d e f g h)
[ $# -ge 1 ] && [ $# -le $((${#letters[@]} + 1)) ] \
  || { echo "usage: $0 PATCH [PATCH ...] (1 to $((${#letters[@]} + 1)) patches)" >&2; exit 2; }
git diff --quiet HEAD -- . || { echo "stack-prepare: the tree has uncommitted changes" >&2; exit 1; }
for p in "$@"; do [ -f "$p" ] || { echo "stack-prepare: no patch $p" >&2; exit 1; }; done
# The patches are read before the tree changes (a patch under docs/pending stays as committed).
patches=$(mktemp -d)
created=()
for i in $(seq 1 $#); do
  cp "${!i}" "$patches/$i.patch"
  created+=($(git apply --summary "${!i}" | awk '$1 == "create" {print $4}'))
done
packed=$(mktemp -d)
# Back to HEAD: tracked files checked out, the files the patches created removed.
restore() {
  git checkout -q HEAD -- .
  for f in "${created[@]}"; do rm -f "$f"; done
}
trap restore EXIT
pack() {
  cargo build --release --bins --quiet
  strip -o "$packed/flash-attn" target/release/flash-attn
  xz -T2 -1 -c "$packed/flash-attn" > "$packed/flash-attn-$1.xz"
}
pack a
stack=""
for i in $(seq 1 $#); do
  git apply "$patches/$i.patch"
  scripts/regen-ptx.sh
  if [ "$i" -lt $# ]; then
    pack "${letters[$((i - 1))]}"
    stack="$stack ${letters[$((i - 1))]}"
  fi
done
scripts/device-prepare.sh
cp "$packed"/flash-attn-*.xz .device-pack/
rm -rf "$patches" "$packed"
ls -la .device-pack
echo "stack-prepare: pass STACK=\"${stack# }\" to ab-session.sh (A = HEAD, B = HEAD + every patch)"
