#!/usr/bin/env bash
# Model-checks the ledger protocol with SPIN (contracts/check-spin.sh; docs/contracts.md).
# Exit 77 (skip) only when spin or a C compiler is missing.
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../../contracts/check-spin.sh"
