#!/usr/bin/env bash
# The device tool sends the working tree (tracked files included) and refuses one over 64 MiB;
# ptx/ alone is ~56 MiB and the recorded runs under reports/h100, reports/h200 ~15 MiB, and a
# device run reads neither (the carried binaries embed the PTX). A stacked A/B's .device-pack
# (six CLIs, ~53 MiB) fits beside the rest only with both set aside.
#   scripts/device-tree.sh hide      move ptx/*.ptx and reports/h100, reports/h200 to .device-stash/
#                                    (git-ignored) before a call
#   scripts/device-tree.sh restore   move them back (builds and `cargo test` need the PTX)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=(h100 h200)
case "${1:-}" in
    hide)
        mkdir -p .device-stash/reports
        for f in ptx/*.ptx; do [ -e "$f" ] && mv "$f" .device-stash/; done
        for r in "${runs[@]}"; do [ -e "reports/$r" ] && mv "reports/$r" .device-stash/reports/; done
        echo "device-tree: ptx/*.ptx and reports/{h100,h200} in .device-stash/; run '$0 restore' after the device call"
        ;;
    restore)
        for f in .device-stash/*.ptx; do [ -e "$f" ] && mv "$f" ptx/; done
        for r in "${runs[@]}"; do
            [ -e ".device-stash/reports/$r" ] || continue
            # New runs recorded while the tree was hidden go in beside the stashed ones.
            if [ -e "reports/$r" ]; then
                cp -rn "reports/$r/." ".device-stash/reports/$r/" && rm -rf "reports/$r"
            fi
            mv ".device-stash/reports/$r" reports/
        done
        git diff --quiet -- ptx || echo "device-tree: ptx/ differs from HEAD (regenerated, or not restored)" >&2
        echo "device-tree: ptx/ and reports/ restored"
        ;;
    *) echo "usage: $0 hide|restore" >&2; exit 2 ;;
esac
