#!/usr/bin/env bash
# The live alerts page is tested in headless Chromium driven by Selenium through chromedriver. Installs
# Debian's chromium and chromium-driver when missing and we may (root with apt-get); otherwise says what
# to install. Idempotent: does nothing when both are on PATH. Nothing is ever downloaded at test time.
set -euo pipefail
present() {
  command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}
if present; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium/chromedriver not found: installing Debian's chromium and chromium-driver for the browser test..."
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
  present && exit 0
fi
echo "error: the browser test needs chromium and chromedriver on PATH. Install them (Debian: apt-get install chromium chromium-driver; Ubuntu: a chromium build with its chromedriver)." >&2
exit 1
