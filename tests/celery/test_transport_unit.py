"""The `ferry://` transport's pieces that need no mesh: registration, names, eta, bodies."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ferry.celery.bridge import task_body
from ferry.celery.naming import MAX_TOPIC_CHARS, deliver_at_ms, topic_for_queue
from ferry.names import validate_group, validate_topic

from tests.support.procs import free_port

kombu = pytest.importorskip("kombu")
REPO = Path(__file__).resolve().parents[2]


def test_import_registers_the_ferry_scheme() -> None:
    import ferry.celery
    from ferry.celery.transport import Transport
    from kombu.transport import resolve_transport
    assert resolve_transport("ferry") is Transport
    conn = kombu.Connection("ferry://10.0.0.7:1234")
    assert conn.transport_cls == "ferry"
    transport = conn.transport
    assert isinstance(transport, Transport) and transport.namesrv == "10.0.0.7:1234"
    assert kombu.Connection("ferry://", transport_options={"namesrv": "a:1,b:2"}
                            ).transport.namesrv == "a:1,b:2"
    assert ferry.celery.Transport is Transport


@pytest.mark.parametrize("first", ["ferry", "kombu"])
def test_import_ferry_alone_lets_celery_resolve_ferry_urls(first: str) -> None:
    """A fresh process: `import ferry` before or after kombu, then Celery(broker="ferry://...")."""
    imports = ("import ferry\nimport kombu.transport\n" if first == "ferry"
               else "import kombu.transport\nimport ferry\n")
    code = imports + (
        "from celery import Celery\n"
        "t = Celery(broker='ferry://127.0.0.1:1').connection_for_write().transport\n"
        "print(type(t).__module__ + '.' + type(t).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ferry.celery.transport.Transport"


def test_import_ferry_does_not_load_kombu() -> None:
    code = "import sys, ferry\nprint('kombu' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert (out.returncode, out.stdout.strip()) == (0, "False"), out.stderr


def test_the_celery_command_imports_the_transport_by_entry_point() -> None:
    project = tomllib.loads((REPO / "libs/ferry/pyproject.toml").read_text())
    target = project["project"]["entry-points"]["celery.commands"]["ferry"]
    module, _, attr = target.partition(":")
    import click
    command = getattr(__import__(module, fromlist=[attr]), attr)
    assert isinstance(command, click.Command)
    assert "celery" in project["project"]["optional-dependencies"]


def test_unreachable_namesrv_is_a_connection_error_kombu_retries() -> None:
    conn = kombu.Connection(f"ferry://127.0.0.1:{free_port()}",
                            transport_options={"publish_timeout_s": 5})
    with pytest.raises(kombu.exceptions.OperationalError):
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    conn.release()


@pytest.mark.parametrize("queue", ["celery", "high-priority", "a_b"])
def test_valid_queue_names_are_topic_names(queue: str) -> None:
    assert topic_for_queue(queue) == queue


@pytest.mark.parametrize("queue", ["celeryev.1f2e", "w1@host.celery.pidbox", "x" * 300,
                                   "celery/x", "日本"])
def test_other_queue_names_map_to_distinct_valid_topics(queue: str) -> None:
    topic = topic_for_queue(queue)
    assert validate_topic(topic) == topic and len(topic) <= MAX_TOPIC_CHARS
    validate_group("celery-" + topic)
    assert topic_for_queue(queue.upper() + "!") != topic


def test_eta_becomes_the_delivery_time() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    now_ms = int(now.timestamp() * 1000)
    later = now + timedelta(seconds=3)
    assert deliver_at_ms({"eta": later.isoformat()}, now_ms=now_ms) == now_ms + 3000
    naive_utc = later.replace(tzinfo=None).isoformat()
    assert deliver_at_ms({"eta": naive_utc}, now_ms=now_ms) == now_ms + 3000
    assert deliver_at_ms({"eta": (now - timedelta(seconds=1)).isoformat()}, now_ms=now_ms) is None
    assert deliver_at_ms({}, now_ms=now_ms) is None
    assert deliver_at_ms({"eta": "not a time"}, now_ms=now_ms) is None
    far = (now + timedelta(days=400)).isoformat()
    assert deliver_at_ms({"eta": far}, now_ms=now_ms, max_delay_ms=1000) == now_ms + 1000


def test_bridge_task_body_shapes() -> None:
    assert task_body(json.dumps({"order": 7}).encode()) == {"order": 7}
    assert task_body(b"plain words") == "plain words"
    assert task_body(b"\xff\x00") == {"base64": "/wA="}


def test_docs_list_every_transport_option_and_its_default() -> None:
    from ferry.celery.feed import FeedConfig
    from ferry.celery.transport import (
        DEFAULT_POLLING_INTERVAL_S,
        DEFAULT_PUBLISH_TIMEOUT_S,
        TRANSPORT_OPTIONS,
    )
    doc = (REPO / "docs/celery.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip()
            for line in doc.splitlines() if line.startswith("| `")}
    defaults = {f: str(getattr(FeedConfig, f)) for f in FeedConfig.__dataclass_fields__
                if f != "namesrv"}
    defaults.update(publish_timeout_s=f"{DEFAULT_PUBLISH_TIMEOUT_S:g}",
                    polling_interval=f"{DEFAULT_POLLING_INTERVAL_S:g}",
                    visibility_timeout=f"{FeedConfig.visibility_timeout_s:g}")
    for option in TRANSPORT_OPTIONS:
        assert option in rows, f"docs/celery.md does not list transport option {option}"
        if option in defaults:
            assert rows[option] == defaults[option], option


@pytest.mark.parametrize("bad", [0, -5, 86_401, "soon", None])
def test_a_bad_visibility_timeout_is_refused_clearly(bad: object) -> None:
    conn = kombu.Connection("ferry://127.0.0.1:1", transport_options={"visibility_timeout": bad})
    with pytest.raises(ValueError, match="visibility_timeout"):
        _ = conn.transport   # kombu makes the transport on first use


def test_visibility_timeout_is_read_in_seconds() -> None:
    transport = kombu.Connection("ferry://127.0.0.1:1",
                                 transport_options={"visibility_timeout": "90"}).transport
    assert transport.config.visibility_timeout_s == 90.0


def test_celery_ferry_subcommand_names_the_transport() -> None:
    from click.testing import CliRunner
    from ferry.celery.command import ferry
    result = CliRunner().invoke(ferry, [])
    assert result.exit_code == 0 and "ferry.celery.transport:Transport" in result.output


def test_celery_bridge_cli_usage() -> None:
    from ferry.cli.main import build_parser
    args = build_parser().parse_args(["celery-bridge", "--topic", "orders", "--group", "billing",
                                      "--task", "app.tasks.bill", "--from", "earliest"])
    assert (args.topic, args.group, args.task, args.from_, args.concurrency) == (
        "orders", "billing", "app.tasks.bill", "earliest", 8)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["celery-bridge", "--topic", "orders", "--group", "g"])


def test_kombu_priority_maps_onto_ferry_levels() -> None:
    from ferry.celery.naming import ferry_priority
    assert [ferry_priority({"priority": p}) for p in range(10)] == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert ferry_priority({"priority": 42}) == 3 and ferry_priority({"priority": -1}) == 0
    assert ferry_priority({}) == ferry_priority({"priority": "high"}) == ferry_priority(None) == 0


@pytest.mark.parametrize("bad", [0, 5])
def test_a_bad_priority_levels_option_is_refused_clearly(bad: int) -> None:
    conn = kombu.Connection("ferry://127.0.0.1:1", transport_options={"priority_levels": bad})
    with pytest.raises(ValueError, match="priority_levels"):
        _ = conn.transport
