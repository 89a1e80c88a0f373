#!/usr/bin/env bash
# Install everything the tests need into .venv, then run them (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh test
exec .venv/bin/python -m pytest "$@"
