#!/usr/bin/env bash
# Prints the secrets docker-compose.yml requires, each made up at random, as a .env file:
#   ./dev/compose-env.sh > .env && docker compose up --build
# Keep the file (the databases remember the passwords they were created with); it is
# git-ignored. Tokens for buyers are signed with SECKILL_JWT_SECRET (`seckill token`);
# payment events with SECKILL_PAYMENT_SECRET (give it to the payment provider).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

secret() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }

cat <<ENV
# Made by dev/compose-env.sh on $(date -u +%FT%TZ). Admin calls: Authorization: Bearer \$SECKILL_ADMIN_TOKEN
SECKILL_ADMIN_TOKEN=$(secret)
SECKILL_JWT_SECRET=$(secret)
SECKILL_PAYMENT_SECRET=$(secret)
SECKILL_MYSQL_PASSWORD=$(secret)
SECKILL_RABBITMQ_PASSWORD=$(secret)
SECKILL_ERLANG_COOKIE=$(secret)
SECKILL_GRAFANA_PASSWORD=$(secret)
ENV
