#!/usr/bin/env bash
# Headless Chromium for tests/test_report_browser.py (Debian's package; no network access at test time).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
