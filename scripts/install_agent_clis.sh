#!/usr/bin/env bash
# Install step: the programs the `codex` and `claude` agents run — the Codex CLI and Claude Code — at the versions
# pinned in tools/agent-clis/package-lock.json, from the npm registry, into
#   $DAEDALUS_CACHE_DIR/agent-clis/<first 16 hex digits of the lock's sha256>/
# with bin/codex and bin/claude linking each package's native binary (no Node.js process runs them). Package
# scripts are not run (`--ignore-scripts`): Claude Code's postinstall only copies that same binary into place.
# Idempotent: a complete install carries a stamp, and a second run only checks it. Prints the install dir.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${DAEDALUS_CACHE_DIR:-$ROOT/.cache}"
TOOLS="$ROOT/tools/agent-clis"
HASH="$(sha256sum "$TOOLS/package-lock.json" | cut -c1-16)"
DEST="$CACHE/agent-clis/$HASH"
if [[ -f "$DEST/.installed" ]]; then
  echo "$DEST"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "the codex and claude agents need npm (Node.js) to install: apt-get install npm, then run this again" >&2
  exit 1
fi
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) CPU=x64 TRIPLE=x86_64-unknown-linux-musl ;;
  Linux-aarch64) CPU=arm64 TRIPLE=aarch64-unknown-linux-musl ;;
  *) echo "no Codex CLI / Claude Code build for $(uname -s)-$(uname -m) in the lock file" >&2; exit 1 ;;
esac
mkdir -p "$CACHE/agent-clis"
TMP="$(mktemp -d "$CACHE/agent-clis/.install.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
cp "$TOOLS/package.json" "$TOOLS/package-lock.json" "$TMP/"
echo "installing the Codex CLI and Claude Code (pinned in tools/agent-clis/package-lock.json) into $DEST" >&2
(cd "$TMP" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
mkdir "$TMP/bin"
ln -s "../node_modules/@openai/codex-linux-$CPU/vendor/$TRIPLE/bin/codex" "$TMP/bin/codex"
ln -s "../node_modules/@anthropic-ai/claude-code-linux-$CPU/claude" "$TMP/bin/claude"
# Each binary must start here (a home of its own, so nothing lands in the user's).
mkdir "$TMP/.check-home"
HOME="$TMP/.check-home" "$TMP/bin/codex" --version >&2
HOME="$TMP/.check-home" "$TMP/bin/claude" --version >&2
rm -rf "$TMP/.check-home"
touch "$TMP/.installed"
# Move into place only when complete, so an interrupted install never leaves half a tree behind.
rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT
echo "$DEST"
