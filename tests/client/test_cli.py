"""The `ferry` command against a real mesh: each sub-command, its output and exit codes."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ferry.cli.main import main as cli_main

from tests.client.conftest import Mesh, unique

pytestmark = pytest.mark.integration

FERRY = str(Path(sys.executable).with_name("ferry"))


def ferry(mesh: Mesh | None, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if mesh is not None:
        env["FERRY_NAMESRV"] = mesh.namesrv
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=timeout_s,
                          env=env, check=False)


def test_help_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    # The installed console script once (it is what a user runs); the sub-commands
    # through its entry point in this process: the same parser, without 0.4 s of
    # interpreter start-up per command.
    res = ferry(None, "--help")
    assert res.returncode == 0, res.stderr
    assert "usage: ferry" in res.stdout
    for args in (["topic"], ["topic", "create"], ["topic", "list"], ["topic", "describe"],
                 ["topic", "delete"], ["topic", "update"], ["send"], ["consume"],
                 ["group", "lag"], ["group", "create"], ["group", "describe"],
                 ["group", "delete"], ["group", "reset-offsets"],
                 ["delay", "cancel"], ["dlq", "list"], ["dlq", "resend"], ["dlq", "purge"],
                 ["txn", "list"], ["txn", "describe"], ["user", "add"], ["user", "list"],
                 ["user", "remove"], ["acl", "grant"], ["acl", "list"], ["acl", "revoke"]):
        with pytest.raises(SystemExit) as exited:
            cli_main([*args, "--help"])
        assert exited.value.code == 0, (args, capsys.readouterr().err)
        assert "usage: ferry" in capsys.readouterr().out, args


def test_topic_lifecycle(mesh: Mesh) -> None:
    topic = unique("cli")
    res = ferry(mesh, "topic", "create", topic, "--queues", "2")
    assert res.returncode == 0, res.stderr
    assert ferry(mesh, "topic", "create", topic).returncode == 1   # already exists
    listed = ferry(mesh, "topic", "list")
    assert listed.returncode == 0 and topic in listed.stdout
    described = ferry(mesh, "topic", "describe", topic)
    assert described.returncode == 0 and '"max_offset": 0' in described.stdout
    assert ferry(mesh, "topic", "delete", topic).returncode == 0
    assert topic not in ferry(mesh, "topic", "list").stdout


def test_group_lifecycle_and_topic_update(mesh: Mesh) -> None:
    topic, group = unique("cli"), unique("g")
    res = ferry(mesh, "group", "create", group, "--retry-max", "3", "--consume-from", "earliest")
    assert res.returncode == 0, res.stderr
    assert '"retry_max": 3' in res.stdout and '"consume_from": "earliest"' in res.stdout
    assert ferry(mesh, "group", "create", group).returncode == 1   # already exists
    assert group in ferry(mesh, "group", "list").stdout
    res = ferry(mesh, "group", "describe", group)
    assert res.returncode == 0 and '"retry_max": 3' in res.stdout and '"resets": []' in res.stdout
    assert ferry(mesh, "group", "delete", group).returncode == 0
    res = ferry(mesh, "group", "describe", group)
    assert res.returncode == 1 and "GroupNotFoundError" in res.stderr
    assert ferry(mesh, "group", "create", "bad name!").returncode == 1

    assert ferry(mesh, "topic", "create", topic, "--queues", "2").returncode == 0
    res = ferry(mesh, "topic", "update", topic, "--queues", "3", "--perm", "r")
    assert res.returncode == 0, res.stderr
    described = ferry(mesh, "topic", "describe", topic).stdout
    assert '"queues": 3' in described and '"perm": "r"' in described
    res = ferry(mesh, "topic", "update", topic, "--queues", "0")
    assert res.returncode == 1 and "queues" in res.stderr
    assert ferry(mesh, "topic", "update", unique("none"), "--queues", "2").returncode == 1


def test_send_consume_and_lag(mesh: Mesh) -> None:
    topic, group = unique("cli"), unique("g")
    res = ferry(mesh, "send", topic, "hello", "--key", "k1", "--tags", "t", "--prop", "a=b",
                "--count", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("sent ") == 3
    res = ferry(mesh, "consume", topic, "--group", group, "--from", "earliest", "--count", "3",
                "--timeout-ms", "20000")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith("\thello") and "key=k1" in line
                                   for line in lines)
    lag = ferry(mesh, "group", "lag", group, "--topic", topic)
    assert lag.returncode == 0 and "total lag: 0" in lag.stdout
    # nothing more: the timeout ends it with exit code 3
    res = ferry(mesh, "consume", topic, "--group", group, "--count", "1", "--timeout-ms", "1500")
    assert res.returncode == 3 and res.stdout == ""


def test_send_trace_forces_a_traced_message(mesh: Mesh, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_TRACE_SAMPLE_RATIO", "0")   # only --trace traces
    topic = unique("cli")
    res = ferry(mesh, "send", topic, "watched", "--trace")
    assert res.returncode == 0, res.stderr
    msg_id = res.stdout.split()[1]
    got = ferry(mesh, "message", "get", msg_id)
    assert got.returncode == 0, got.stderr
    assert "TRACEPARENT" in got.stdout   # the W3C context travels with the message
    plain = ferry(mesh, "send", topic, "unwatched")
    got = ferry(mesh, "message", "get", plain.stdout.split()[1])
    assert got.returncode == 0 and "TRACEPARENT" not in got.stdout


def test_errors_are_clear() -> None:
    res = ferry(None, "--namesrv", "127.0.0.1:1", "topic", "list")
    assert res.returncode == 1 and res.stderr.startswith("error: ConnectionLostError")
    res = ferry(None, "send", "bad%topic", "x")
    assert res.returncode == 1 and "InvalidNameError" in res.stderr
    assert ferry(None, "consume", "t").returncode == 2   # --group is required


def test_sql_subscription_and_priorities(mesh: Mesh) -> None:
    topic, group = unique("cli"), unique("g")
    res = ferry(mesh, "topic", "create", topic, "--queues", "4", "--priority-levels", "2",
                "--broker", "broker-a")
    assert res.returncode == 0 and '"priority_levels": 2' in res.stdout, res.stderr
    assert ferry(mesh, "topic", "create", unique("cli"), "--queues", "2",
                 "--priority-levels", "3").returncode == 1   # more levels than queues
    for amount in (50, 150, 250):
        res = ferry(mesh, "send", topic, f"a{amount}", "--prop", f"amount={amount}",
                    "--priority", "3" if amount == 250 else "0")
        assert res.returncode == 0, res.stderr
        queue_id = int(res.stdout.split("#")[1].split()[0])
        assert (queue_id >= 2) == (amount == 250)   # level 1 is queues 2 and 3
    assert ferry(mesh, "send", topic, "x", "--priority", "4").returncode == 2
    res = ferry(mesh, "consume", topic, "--group", group, "--from", "earliest",
                "--sql", "amount > 100", "--count", "2", "--timeout-ms", "20000")
    assert res.returncode == 0, res.stderr
    assert sorted(line.split("\t")[-1] for line in res.stdout.splitlines()) == ["a150", "a250"]
    res = ferry(mesh, "consume", topic, "--group", group, "--sql", "amount >", "--count", "1")
    assert res.returncode == 1 and "InvalidFilterError" in res.stderr and "column" in res.stderr
    assert ferry(mesh, "consume", topic, "--group", group, "--sql", "a = 1",
                 "--tags", "x").returncode == 2   # one filter or the other
