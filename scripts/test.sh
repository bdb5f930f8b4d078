#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: lint, then pytest against ../shared/spec.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check enforcer tests bench examples setup.py
.venv/bin/python -m pytest tests "$@"
