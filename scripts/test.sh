#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: lint, type check, then pytest against ../shared/spec
# with the full budgets; --full also fails the run when it is not root or a root-only test was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check enforcer tests bench examples setup.py
.venv/bin/mypy
.venv/bin/python -m pytest tests --full --durations=20 "$@"
