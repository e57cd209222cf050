#!/usr/bin/env bash
# Spark needs Java 17 or newer. Installs Debian's headless JDK when Java is missing and we may (root with
# apt-get); otherwise says what to install. The JDK's javac is optional: local mode compiles one small
# Hadoop class with it on first use (infra/spark/session.py) and runs slower without it.
set -euo pipefail
version_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local major
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  [ -n "$major" ] && [ "$major" -ge 17 ]
}
if version_ok; then
  command -v javac >/dev/null 2>&1 || echo "note: no javac (a JDK): Spark's local mode runs without infra/spark/jvm, slower." >&2
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Java 17+ not found: installing Debian's openjdk-17-jdk-headless for Spark..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
  version_ok && exit 0
fi
echo "error: Spark needs Java 17 or newer on PATH. Install it (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless)." >&2
exit 1
