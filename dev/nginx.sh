#!/usr/bin/env bash
# Runs nginx in the foreground with nginx/seckill.conf, in front of two seckill servers:
#   dev/nginx.sh LISTEN API_1 API_2 [STATE_DIR]
#   dev/nginx.sh 127.0.0.1:8000 127.0.0.1:8081 127.0.0.1:8082
# SECKILL_LOAD_HOSTS="10.0.0.5 10.0.0.6" exempts a rehearsal's load generators on other
# hosts from the per-address limit, as this host's own are (nginx/seckill.conf, geo).
# The storefront under web/ is served from this checkout. Everything nginx writes (its
# rendered config, pid, logs, temp files) goes to STATE_DIR (default target/nginx).
# nginx must be installed (dev/tools.sh nginx installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
. dev/lib.sh

if (($# < 3)); then
  echo "usage: $0 LISTEN API_1 API_2 [STATE_DIR]" >&2
  exit 2
fi
listen=$1 api1=$2 api2=$3 state=${4:-target/nginx}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$nginx" ] || die "nginx is not installed: sudo apt-get install nginx (or dev/tools.sh nginx as root)"
mime=/etc/nginx/mime.types
[ -r "$mime" ] || die "$mime is missing (it comes with Debian's nginx-common)"

mkdir -p "$state/tmp"
state=$(cd "$state" && pwd)
web=$(pwd)/web
# Started as root, nginx drops its workers to an unprivileged user (nobody), who cannot
# read a checkout in a private directory (a clone under /root, or in `mktemp -d`): the
# workers then run as the owner of web/, who can.
user_line=""
if [ "$(id -u)" = 0 ]; then
  user_line="user $(stat -c '%U %G' "$web");"
fi

# Fill in the four addresses of the template (nothing else in it is touched), and add the
# load hosts to the exempt addresses after the template's last one.
exempt=""
for host in ${SECKILL_LOAD_HOSTS:-}; do
  [[ $host =~ ^[0-9A-Fa-f.:/]+$ ]] || { echo "SECKILL_LOAD_HOSTS: $host is not an address" >&2; exit 2; }
  exempt+="\n    $host \"\";"
done
sed -e "s|\${SECKILL_LISTEN}|$listen|g" -e "s|\${SECKILL_API_1}|$api1|g" \
  -e "s|\${SECKILL_API_2}|$api2|g" -e "s|\${SECKILL_WEB_ROOT}|$web|g" \
  -e "s|^    ::1        \"\";\$|&$exempt|" \
  nginx/seckill.conf >"$state/seckill.conf"
cp nginx/seckill_proxy.conf "$state/seckill_proxy.conf"

cat >"$state/nginx.conf" <<CONF
# Written by dev/nginx.sh: a private nginx for one checkout.
daemon off;
$user_line
worker_processes auto;
pid $state/nginx.pid;
error_log $state/error.log warn;
events { worker_connections 4096; }
http {
    include $mime;
    default_type application/octet-stream;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests 100000;
    access_log off;
    client_body_temp_path $state/tmp/body;
    proxy_temp_path $state/tmp/proxy;
    fastcgi_temp_path $state/tmp/fastcgi;
    uwsgi_temp_path $state/tmp/uwsgi;
    scgi_temp_path $state/tmp/scgi;
    include $state/seckill.conf;
}
CONF

"$nginx" -t -q -p "$state" -c "$state/nginx.conf"
echo "nginx on $listen → $api1, $api2 (storefront from $web)" >&2
exec "$nginx" -p "$state" -c "$state/nginx.conf"
