#!/usr/bin/env bash
# Install what the dashboard's browser test drives: Debian's Chromium and its matching
# chromedriver (tests/e2e/test_dashboard.py skips, saying so, when they are missing).
# Nothing else is downloaded: Selenium uses these two binaries, never a browser of its own.
# Measured on the 2-core development machine: docs/dashboard.md, "The browser test".
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "chromium and chromedriver already installed: $(chromium --version 2>/dev/null)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
sudo_if_needed=()
[[ $(id -u) -eq 0 ]] || sudo_if_needed=(sudo)
"${sudo_if_needed[@]}" apt-get update -qq
"${sudo_if_needed[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver
echo "installed: $(chromium --version 2>/dev/null)"
