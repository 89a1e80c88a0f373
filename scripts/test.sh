#!/usr/bin/env bash
# Install everything the tests need into .venv, then run them (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh test
# The playground test drives Debian's chromium (Playwright's own browser download is not used).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the playground test will be skipped" >&2
fi
.venv/bin/ruff check src tests benchmarks  # the rules in pyproject.toml; a finding fails the run
.venv/bin/ruff format --check src tests benchmarks
exec .venv/bin/python -m pytest "$@"
