"""Service settings from the environment: one frozen dataclass built from FERRY_<SERVICE>_<KEY>.

Every service's config is a frozen dataclass whose fields are its settings;
`from_env` fills it from `<prefix><FIELD>` variables (parsed by each field's
type), then lets `overrides` (command-line flags, non-None values) win;
`service_from_env` adds the mesh-wide auth switch FERRY_AUTH. The dataclass's
own `__post_init__` checks ranges, starting with `check_service` (the checks
every service shares: log level, no negative numbers, the port, etcd for auth).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

from ferry.auth.credentials import auth_enabled
from ferry.env import parse_bool

T = TypeVar("T")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# A field with this name is upper-cased wherever it comes from ("debug" -> "DEBUG").
LOG_LEVEL_FIELD = "log_level"


def from_env(cls: type[T], prefix: str, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None,
             error: type[ValueError] = ValueError) -> T:
    """Build the dataclass `cls` from `<prefix><FIELD>` variables, then `overrides`.

    A variable set to an empty string (or only spaces) counts as unset unless its
    field is a string, where "" is a value ("no etcd"). A value that does not parse
    raises `error` naming the variable; `overrides` keys must be field names.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        raw = env.get(prefix + f.name.upper())
        if raw is None:
            continue
        type_name = _type_name(f.type)
        raw = raw.strip()
        if raw != "" or type_name == "str":
            values[f.name] = parse_value(raw, type_name, prefix + f.name.upper(), error)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    if LOG_LEVEL_FIELD in values:
        values[LOG_LEVEL_FIELD] = str(values[LOG_LEVEL_FIELD]).upper()
    return cls(**values)


def service_from_env(cls: type[T], prefix: str, env: Mapping[str, str] | None = None,
                     overrides: Mapping[str, Any] | None = None,
                     error: type[ValueError] = ValueError) -> T:
    """`from_env` with the `auth` field set by FERRY_AUTH, the one switch every service reads
    (not a `<prefix>AUTH` variable); `overrides` (non-None) still win."""
    try:
        auth = auth_enabled(env)
    except ValueError as exc:
        raise error(str(exc)) from None
    return from_env(cls, prefix, env, {"auth": auth, **(overrides or {})}, error)


def check_service(config: Any, prefix: str, may_be_zero: frozenset[str] = frozenset(),
                  port_field: str = "http_port", error: type[ValueError] = ValueError) -> None:
    """The checks every service's config starts with: etcd when auth is on (identities live
    there), a known log level, every number positive (or 0 when its field is in
    `may_be_zero`; the port may always be 0: a free one), the port within 0..65535."""
    if getattr(config, "auth", False) and getattr(config, "etcd", None) == "":
        raise error(f"FERRY_AUTH=on needs {prefix}ETCD: identities and their rules live "
                    "in etcd")
    if config.log_level.upper() not in LOG_LEVELS:
        raise error(f"log_level must be one of {', '.join(LOG_LEVELS)}")
    zero_ok = may_be_zero | {port_field}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if _type_name(f.type) not in ("int", "float") or isinstance(value, bool):
            continue
        if value < 0 or (value == 0 and f.name not in zero_ok):
            raise error(f"{f.name} must be positive, not {value}")
    port = getattr(config, port_field)
    if not 0 <= port < 65536:
        raise error(f"{port_field} must be in 0..65535, not {port}")


@dataclass(frozen=True)
class ServiceConfig:
    """The fields every service's config dataclass starts with; `from_env` reads them and
    the subclass's own from `ENV_PREFIX` variables (`config_error`: namesrv's own error)."""

    ENV_PREFIX: ClassVar[str] = ""
    config_error: ClassVar[type[ValueError]] = ValueError

    host: str = "127.0.0.1"   # the HTTP listen address
    log_level: str = "INFO"
    # FERRY_AUTH=on (the one switch every service reads, not a <PREFIX>AUTH variable):
    # every route but /healthz, /readyz and /openapi.json needs a signed request with its
    # permission; the identities come from etcd.
    auth: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> Self:
        """Build from <ENV_PREFIX><FIELD> variables and FERRY_AUTH; `overrides` (non-None,
        the command line's flags) win."""
        return service_from_env(cls, cls.ENV_PREFIX, env, overrides, cls.config_error)


@dataclass(frozen=True)
class MeshServiceConfig(ServiceConfig):
    """A service that reaches the brokers (through namesrv) and etcd (identities, elections)."""

    namesrv: str = "127.0.0.1:9876"
    etcd: str = "127.0.0.1:2379"
    etcd_prefix: str = "/ferry/"   # where identities (and leader keys) live


@dataclass(frozen=True)
class InstanceConfig(MeshServiceConfig):
    """A service instance with a data directory of its own and an id among its peers."""

    data_dir: str = ""   # each service sets its default (./var/<service>)
    instance_id: str = ""   # empty = host name + a random suffix

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @functools.cached_property
    def node_id(self) -> str:
        """`instance_id`, or the host name and a random suffix when it is empty (chosen once:
        the election, the logs and the spans name the same instance)."""
        return self.instance_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


def parse_value(raw: str, type_name: str, what: str,
                error: type[ValueError] = ValueError) -> Any:
    """`raw` as a value of the type named `type_name` ("int", "float", "bool", "str")."""
    if type_name == "bool":
        return parse_bool(raw, what, error)
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
    except ValueError:
        kind = "a number (an integer)" if type_name == "int" else "a number"
        raise error(f"{what} must be {kind}, not {raw!r}") from None
    return raw


def _type_name(annotation: object) -> str:
    # Under `from __future__ import annotations` a field's type is its source text.
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
