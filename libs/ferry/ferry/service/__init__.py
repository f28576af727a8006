"""The service kit: the one way a Ferry service is configured, started, made ready, stopped
and served over HTTP (docs/service-kit.md).

- `config`: the config dataclass from FERRY_<SERVICE>_* variables, and the checks every
  service shares;
- `startup`: `python -m ferry_<service>`: flags over the environment, logging, run;
- `app` and `lifecycle`: start, ready, stop steps, serving until SIGTERM/SIGINT;
- `http`, `errors`, `limits`, `admission`, `openapi`: the HTTP API every service serves
  (/healthz, /readyz, /openapi.json, /v1/stats, the JSON error body, request limits);
- `auth` and `auth_registry`: checking signed requests against the identities in etcd.

Nothing is re-exported here: importing the kit's config does not pull in aiohttp.
"""
