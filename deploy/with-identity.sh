#!/bin/sh
# Start a Ferry service under its own identity (deploy/docker-compose.yml, auth on):
#   with-identity.sh ACCESS_KEY python -m ferry_xxx
# waits until auth-init has written the identity's secret to /run/ferry-auth/ACCESS_KEY,
# then runs the command with FERRY_ACCESS_KEY / FERRY_SECRET_KEY set (the secret is read
# from the file, never put in the compose file or an image).
set -eu
key="$1"; shift
file="${FERRY_AUTH_SECRETS_DIR:-/run/ferry-auth}/$key"
waited=0
while [ ! -s "$file" ]; do
    if [ "$waited" -ge 120 ]; then
        echo "with-identity: no secret for $key in $file after 120 s (did auth-init run?)" >&2
        exit 1
    fi
    sleep 1; waited=$((waited + 1))
done
FERRY_ACCESS_KEY="$key"
FERRY_SECRET_KEY="$(cat "$file")"
export FERRY_ACCESS_KEY FERRY_SECRET_KEY
exec "$@"
