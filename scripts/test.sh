#!/usr/bin/env bash
# The whole test suite: system packages, type check, every test file under test/
# (node:test through tsx), including the conformance runner over ../shared/conformance.
# Kernel tests (network namespaces, the IPVS VM) need root; CI runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-system.sh
[ -d node_modules ] || npm ci --no-audit --no-fund
npx tsc --noEmit -p .
mapfile -t files < <(find test -name '*.test.ts' | sort)
if [ "$#" -gt 0 ]; then files=("$@"); fi
node --import tsx --test --test-concurrency=1 --test-timeout=900000 "${files[@]}"
