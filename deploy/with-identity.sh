#!/bin/sh
# Start a Ferry service under its own identity (deploy/docker-compose.yml, auth on):
#   with-identity.sh ACCESS_KEY python -m ferry_xxx
# waits until auth-init has written the identity's secret to /run/ferry-auth/ACCESS_KEY
# (the identity's own volume: a container mounts no other secret), then runs the command
# with FERRY_ACCESS_KEY / FERRY_SECRET_KEY set (the secret is read from the file, never put
# in the compose file or an image). Settings auth-init wrote for the service in
# /run/ferry-auth/env (NAME=value lines of FERRY_ variables: dedup's Redis and ledger URLs,
# which carry their passwords) are exported too.
set -eu
key="$1"; shift
dir="${FERRY_AUTH_SECRETS_DIR:-/run/ferry-auth}"
file="$dir/$key"
waited=0
while [ ! -s "$file" ]; do
    if [ "$waited" -ge 120 ]; then
        echo "with-identity: no secret for $key in $file after 120 s (did auth-init run?)" >&2
        exit 1
    fi
    sleep 1; waited=$((waited + 1))
done
if [ -f "$dir/env" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            FERRY_*=*) export "$line" ;;
            "") ;;
            *) echo "with-identity: ignoring a line of $dir/env that sets no FERRY_ variable" >&2 ;;
        esac
    done < "$dir/env"
fi
FERRY_ACCESS_KEY="$key"
FERRY_SECRET_KEY="$(cat "$file")"
export FERRY_ACCESS_KEY FERRY_SECRET_KEY
exec "$@"
