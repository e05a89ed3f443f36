#!/usr/bin/env bash
# The device tool sends the working tree (tracked files included) and refuses one over 64 MiB;
# ptx/ alone is ~56 MiB, and a device run does not read it (the carried binaries embed it).
#   scripts/device-tree.sh hide      move ptx/*.ptx to .device-stash/ (git-ignored) before a call
#   scripts/device-tree.sh restore   move them back (builds and `cargo test` need them)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    hide)
        mkdir -p .device-stash
        for f in ptx/*.ptx; do [ -e "$f" ] && mv "$f" .device-stash/; done
        echo "device-tree: ptx/*.ptx in .device-stash/; run '$0 restore' after the device call"
        ;;
    restore)
        for f in .device-stash/*.ptx; do [ -e "$f" ] && mv "$f" ptx/; done
        git diff --quiet -- ptx || echo "device-tree: ptx/ differs from HEAD (regenerated, or not restored)" >&2
        echo "device-tree: ptx/ restored"
        ;;
    *) echo "usage: $0 hide|restore" >&2; exit 2 ;;
esac
