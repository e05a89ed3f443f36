#!/usr/bin/env bash
# Builds the tensor-core backward's GPU test and timing example on this machine and copies them,
# stripped, with the run script and the commit they came from, to <root>/.device-run/tcb/
# (git-ignored). <root> defaults to this checkout; the device tool sends only its own working
# tree, so pass the checkout it sends (e.g. /work/main), then call the tool with
# carry [".device-run"] and `bash .device-run/tcb/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.}/.device-run/tcb
rm -rf "$dest" && mkdir -p "$dest"
cargo build --release --example tc_backward_bench --quiet
cp target/release/examples/tc_backward_bench "$dest/"
cargo test --release --test gpu_tensor_core_backward --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/gpu_tensor_core_backward")
' "$dest"
strip "$dest"/tc_backward_bench "$dest"/gpu_tensor_core_backward
cp scripts/device-run-tc-backward.sh "$dest/run.sh"
echo "$(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!reports' || echo ' +uncommitted changes')" > "$dest/COMMIT"
du -sh "$dest"
