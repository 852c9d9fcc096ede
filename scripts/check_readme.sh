#!/usr/bin/env bash
# Runs every command the README shows, as written: the two quick-start commands (unless
# --no-quick-start, when the build and the test suite have just run anyway), and the commands on
# the config it shows, saved as cfg.json in a scratch copy of the clone's top folder (with the
# build linked in). Fails at the first command that fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
quick=1
[ "${1:-}" = "--no-quick-start" ] && quick=0
cd "$root"
if [ "$quick" = 1 ]; then
  sed -n '/^```sh$/,/^```$/p' README.md | grep '^bash ' | sed 's/ *#.*//' | while read -r cmd; do
    echo "check_readme: $cmd"
    bash -c "$cmd" >/dev/null
  done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$root/build" "$work/build"
# The README's config block is its only ```json block.
sed -n '/^```json$/,/^```$/p' README.md | sed '1d;$d' >"$work/cfg.json"
grep -o '`build/apps/pipetrain [^`]*`' README.md | tr -d '`' | sort -u | while read -r cmd; do
  echo "check_readme: $cmd"
  (cd "$work" && bash -c "$cmd" >"$work/out.txt" 2>&1) || { cat "$work/out.txt" >&2; exit 1; }
done
echo "check_readme: every command ran"
