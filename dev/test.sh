#!/usr/bin/env bash
# The second command of the README (and what CI runs): services up, then formatting,
# lints and every test — unit and integration, against the real Redis, MariaDB and
# RabbitMQ. Extra arguments go to `cargo test` (a test name filters).
set -euo pipefail
cd "$(dirname "$0")/.."

./dev/services.sh
# The compose-file test uses `docker compose` or Debian's docker-compose when present.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && command -v docker >/dev/null \
  && ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null || true
fi
# The edge and storefront tests run a real nginx and a headless Chromium (Debian's
# packages) driven by Node's playwright-core.
./dev/tools.sh nginx chromium node npm
if [ ! -d web/node_modules/playwright-core ]; then
  echo "[test] npm ci in web/ (playwright-core)" >&2
  (cd web && npm ci --silent --no-audit --no-fund)
fi

cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked "$@"
