"""`ferry user` / `ferry acl` against real etcd, namesrv and a broker with FERRY_AUTH=on:
the bootstrap admin, identities added through namesrv, grants that take effect at the
broker without a restart, deny over allow, removal; a new identity's secret read from a
file or standard input, never from the command line."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ferry.cli.secret_input import read_secret
from ferry.errors import MalformedRequestError

from tests.broker.conftest import Broker, start_broker
from tests.support.procs import Etcd, Proc, start_namesrv

pytestmark = pytest.mark.integration

FERRY = str(Path(sys.executable).with_name("ferry"))
APP_SECRET = "app-secret-0123456789"


class AuthMesh:
    def __init__(self, etcd: Etcd, prefix: str, namesrv: Proc, namesrv_port: int,
                 broker: Broker) -> None:
        self.etcd, self.prefix, self.namesrv, self.broker = etcd, prefix, namesrv, broker
        self.namesrv_addr = f"127.0.0.1:{namesrv_port}"
        self.root_secret = ""

    def ferry(self, *args: str, as_: tuple[str, str] | None = None, stdin: str | None = None
              ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("FERRY_ACCESS_KEY", "FERRY_SECRET_KEY")}
        env["FERRY_NAMESRV"] = self.namesrv_addr
        if as_ is not None:
            env["FERRY_ACCESS_KEY"], env["FERRY_SECRET_KEY"] = as_
        return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=60,
                              env=env, check=False, input=stdin)

    @property
    def root(self) -> tuple[str, str]:
        return ("root", self.root_secret)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[AuthMesh]:
    workdir = tmp_path_factory.mktemp("auth-cli")
    prefix = f"/ferry-auth-cli-{uuid.uuid4().hex[:8]}/"
    namesrv, port = start_namesrv(etcd.endpoint, prefix, workdir / "namesrv",
                                  {"FERRY_AUTH": "on"})
    broker = start_broker(workdir / "broker", etcd, prefix=prefix, FERRY_AUTH="on",
                          FERRY_BROKER_NAME="broker-auth", FERRY_BROKER_DEFAULT_QUEUES="2")
    yield AuthMesh(etcd, prefix, namesrv, port, broker)
    broker.proc.stop()
    namesrv.stop()
    print(broker.proc.log()[-3000:])


def _retry(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether `check` turns true within the time a change takes to reach the broker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_bootstrap_grant_deny_revoke_remove(mesh: AuthMesh, tmp_path: Path) -> None:
    res = mesh.ferry("user", "add", "root", "--admin", "--bootstrap", "--etcd",
                     mesh.etcd.endpoint, "--etcd-prefix", mesh.prefix)
    assert res.returncode == 0, res.stderr
    secret_line = next(line for line in res.stdout.splitlines() if line.startswith("secret: "))
    mesh.root_secret = secret_line.removeprefix("secret: ")
    again = mesh.ferry("user", "add", "root2", "--admin", "--bootstrap", "--etcd",
                       mesh.etcd.endpoint, "--etcd-prefix", mesh.prefix)
    assert again.returncode == 1 and "AlreadyExistsError" in again.stderr

    secret_file = tmp_path / "app.secret"
    secret_file.write_text(APP_SECRET + "\n")
    res = mesh.ferry("user", "add", "app", "--secret-file", str(secret_file),
                     "--description", "orders app", as_=mesh.root)
    assert res.returncode == 0, res.stderr
    assert APP_SECRET not in res.stdout and "secret:" not in res.stdout
    listed = mesh.ferry("user", "list", as_=mesh.root)
    assert '"access_key": "app"' in listed.stdout and '"key"' not in listed.stdout
    app = ("app", APP_SECRET)

    # No rules yet: the broker refuses; after the grant it takes the message.
    assert "AccessDeniedError" in mesh.ferry("send", "orders", "x", as_=app).stderr
    res = mesh.ferry("acl", "grant", "app", "--topic", "orders*", "--perm", "pub", as_=mesh.root)
    assert res.returncode == 0, res.stderr
    assert _retry(lambda: mesh.ferry("send", "orders", "hello", as_=app).returncode == 0)
    res = mesh.ferry("send", "payments", "hello", as_=app)
    assert res.returncode == 1 and "AccessDeniedError" in res.stderr and "payments" in res.stderr

    # Deny beats allow; revoking the deny restores the allow.
    mesh.ferry("acl", "grant", "app", "--topic", "orders-secret", "--perm", "pub", "--deny",
               as_=mesh.root)
    assert _retry(lambda: "AccessDeniedError" in mesh.ferry("send", "orders-secret", "x",
                                                            as_=app).stderr)
    assert mesh.ferry("send", "orders-eu", "x", as_=app).returncode == 0
    rules = mesh.ferry("acl", "list", "app", as_=mesh.root).stdout
    assert '"deny"' in rules and "topic:orders-secret" in rules
    mesh.ferry("acl", "revoke", "app", "--topic", "orders-secret", "--deny", as_=mesh.root)
    assert _retry(lambda: mesh.ferry("send", "orders-secret", "x", as_=app).returncode == 0)

    # Scenes (dedup claims) are granted and revoked the same way; an action of another
    # kind is refused with what would do.
    res = mesh.ferry("acl", "grant", "app", "--scene", "billing.eu", "--perm", "claim",
                     as_=mesh.root)
    assert res.returncode == 0, res.stderr
    assert "scene:billing.eu" in mesh.ferry("acl", "list", "app", as_=mesh.root).stdout
    res = mesh.ferry("acl", "grant", "app", "--scene", "billing", "--perm", "pub",
                     as_=mesh.root)
    assert res.returncode == 1 and "does not apply to scene: use claim" in res.stderr
    mesh.ferry("acl", "revoke", "app", "--scene", "billing.eu", as_=mesh.root)
    assert "scene:" not in mesh.ferry("acl", "list", "app", as_=mesh.root).stdout
    # A slave identity is granted the broker ids it may link as; admin replicate is no more.
    res = mesh.ferry("acl", "grant", "app", "--broker", "broker-a/1", "--perm", "replicate",
                     as_=mesh.root)
    assert res.returncode == 0, res.stderr
    assert "broker:broker-a/1" in mesh.ferry("acl", "list", "app", as_=mesh.root).stdout
    res = mesh.ferry("acl", "grant", "app", "--admin", "replicate", as_=mesh.root)
    assert res.returncode == 1 and "broker:<name>/<id>" in res.stderr
    mesh.ferry("acl", "revoke", "app", "--broker", "broker-a/1", as_=mesh.root)
    assert "broker:" not in mesh.ferry("acl", "list", "app", as_=mesh.root).stdout

    # A wrong secret, then a removed identity, are refused at once.
    res = mesh.ferry("send", "orders", "x", as_=("app", "not-the-secret-at-all"))
    assert res.returncode == 1 and "AuthenticationError" in res.stderr
    assert mesh.ferry("user", "remove", "app", as_=mesh.root).returncode == 0
    assert _retry(lambda: "unknown or disabled" in mesh.ferry("send", "orders", "x",
                                                              as_=app).stderr)


def test_a_secret_on_the_command_line_is_refused(mesh: AuthMesh) -> None:
    """`--secret S` (in `ps` and the shell history) is a usage error pointing at the other
    ways; the identity is not created and the error never repeats the secret."""
    assert mesh.root_secret, "runs after the bootstrap test"
    secret = "on-the-command-line-0123"
    for argv in (["--secret", secret], [f"--secret={secret}"]):
        res = mesh.ferry("user", "add", "cmdline", *argv, as_=mesh.root)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "--secret was removed" in res.stderr and "--secret-file" in res.stderr
        assert secret not in res.stdout + res.stderr
    assert '"cmdline"' not in mesh.ferry("user", "list", as_=mesh.root).stdout


def test_a_secret_from_standard_input_or_a_file(mesh: AuthMesh, tmp_path: Path) -> None:
    """`--secret-file -` takes the first line of a piped standard input; the identity then
    signs with that secret. A bad file is a clear error that does not show its content."""
    assert mesh.root_secret, "runs after the bootstrap test"
    piped = "piped-secret-0123456789"
    res = mesh.ferry("user", "add", "piped", "--secret-file", "-", as_=mesh.root,
                     stdin=piped + "\n")
    assert res.returncode == 0, res.stderr
    assert piped not in res.stdout and "secret:" not in res.stdout
    mesh.ferry("acl", "grant", "piped", "--admin", "read", as_=mesh.root)
    assert _retry(lambda: mesh.ferry("topic", "list", as_=("piped", piped)).returncode == 0)
    assert "AuthenticationError" in mesh.ferry("topic", "list",
                                               as_=("piped", "not-the-piped-secret")).stderr

    short = tmp_path / "short"
    short.write_text("too-short\n")
    two_lines = tmp_path / "two-lines"
    two_lines.write_text("first-line-0123456789\nsecond-line-0123456789\n")
    for path, why in ((short, "16 to 256 characters"), (two_lines, "on one line"),
                      (tmp_path / "missing", "cannot read the secret file")):
        res = mesh.ferry("user", "add", "badfile", "--secret-file", str(path), as_=mesh.root)
        assert res.returncode == 1 and why in res.stderr, res.stderr
        assert "too-short" not in res.stderr and "first-line" not in res.stderr
    res = mesh.ferry("user", "add", "nothing", "--secret-file", "-", as_=mesh.root, stdin="")
    assert res.returncode == 1 and "standard input is empty" in res.stderr
    listed = mesh.ferry("user", "list", as_=mesh.root).stdout
    assert '"piped"' in listed and '"badfile"' not in listed and '"nothing"' not in listed


def test_a_terminal_is_prompted_twice_without_echo() -> None:
    """On a terminal `--secret-file -` asks with getpass (no echo), and twice."""
    answers = iter(["typed-secret-0123456789", "typed-secret-0123456789"])
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return next(answers)

    assert read_secret("-", _Terminal(), prompt) == "typed-secret-0123456789"
    assert asked == ["secret: ", "secret (again): "]
    differ = iter(["typed-secret-0123456789", "typo-secret-0123456789"])
    with pytest.raises(MalformedRequestError, match="differ"):
        read_secret("-", _Terminal(), lambda _text: next(differ))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True
