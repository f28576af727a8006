"""Credentials: validation, the derived signing key, the environment, and no secret in repr."""
from __future__ import annotations

import hashlib
import hmac

import pytest
from ferry.auth.credentials import Credentials, derive_signing_key, generate_secret
from ferry.errors import MalformedRequestError
from ferry.service.auth_registry import User

SECRET = "s3cret-s3cret-s3cret"


def test_signing_key_is_the_documented_derivation() -> None:
    creds = Credentials("alice", SECRET)
    expected = hmac.new(SECRET.encode(), b"ferry-signing-key/1\nalice", hashlib.sha256).digest()
    assert creds.signing_key == expected == derive_signing_key("alice", SECRET)
    assert Credentials("bob", SECRET).signing_key != expected  # bound to the access key


def test_repr_hides_the_secret() -> None:
    creds = Credentials("alice", SECRET)
    assert SECRET not in repr(creds) and SECRET not in str(creds)
    assert "alice" in repr(creds)


def test_registry_user_repr_hides_the_signing_key() -> None:
    key = derive_signing_key("alice", SECRET)
    user = User("alice", key, 1)
    assert repr(key) not in repr(user) and "signing_key" not in repr(user)
    assert "alice" in repr(user)


@pytest.mark.parametrize("access_key", ["ab", "a" * 65, "al ice", "al:ice", "", 12])
def test_bad_access_keys_are_refused(access_key: object) -> None:
    with pytest.raises(MalformedRequestError, match="access key"):
        Credentials(access_key, SECRET)  # type: ignore[arg-type]


@pytest.mark.parametrize("secret", ["short", "x" * 257, "tab\tin-the-secret-here"])
def test_bad_secrets_are_refused(secret: str) -> None:
    with pytest.raises(MalformedRequestError, match="secret"):
        Credentials("alice", secret)


def test_generated_secrets_are_random_and_valid() -> None:
    a, b = generate_secret(), generate_secret()
    assert a != b and len(a) >= 40
    Credentials("alice", a)


def test_from_env() -> None:
    assert Credentials.from_env(env={}) is None
    env = {"FERRY_ACCESS_KEY": "alice", "FERRY_SECRET_KEY": SECRET}
    assert Credentials.from_env(env=env) == Credentials("alice", SECRET)
    # A service's own pair wins over the generic one, which is the fallback.
    own = dict(env, FERRY_DELAY_SCHEDULER_ACCESS_KEY="sched",
               FERRY_DELAY_SCHEDULER_SECRET_KEY=SECRET + "x")
    assert Credentials.from_env("FERRY_DELAY_SCHEDULER", env=own).access_key == "sched"
    assert Credentials.from_env("FERRY_DELAY_SCHEDULER", env=env).access_key == "alice"
    with pytest.raises(MalformedRequestError, match="together"):
        Credentials.from_env(env={"FERRY_ACCESS_KEY": "alice"})


def test_auth_switch_and_service_identities() -> None:
    from ferry.auth.credentials import auth_enabled, service_credentials

    assert not auth_enabled({}) and not auth_enabled({"FERRY_AUTH": "off"})
    assert auth_enabled({"FERRY_AUTH": "on"}) and auth_enabled({"FERRY_AUTH": "TRUE"})
    with pytest.raises(ValueError, match="FERRY_AUTH"):
        auth_enabled({"FERRY_AUTH": "maybe"})
    env = {"FERRY_TXN_CHECKER_ACCESS_KEY": "checker", "FERRY_TXN_CHECKER_SECRET_KEY": SECRET}
    creds = service_credentials("txn-checker", env)
    assert creds is not None and creds.access_key == "checker"
    assert service_credentials("delay-scheduler", env) is None
