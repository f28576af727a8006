"""The `ferry` source and sink with FERRY_AUTH=on: every request signed with the
accessKey/secretKey options, refused without credentials or without the right.

Reading needs `sub` on the topic (+ `consume` on the source's PULL group
ferry-spark-reader, or admin read); writing needs `pub`. The secret never shows
in the query plan or an error.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from ferry import Admin

from tests.broker.auth_support import ADMIN_RULES, creds, rules, seeded_mesh
from tests.client.conftest import Mesh, unique
from tests.spark.conftest import send_messages
from tests.support.procs import Etcd

pytestmark = [pytest.mark.slow, pytest.mark.integration]

COUNT = 50
ADMIN = creds("spark-admin")
READER = creds("spark-reader")     # sub on sa-*, consume on the source's PULL group
WRITER = creds("spark-writer")     # pub on sa-* only: no sub
IDENTITIES = {
    ADMIN.access_key: ADMIN_RULES,
    READER.access_key: rules(("allow", "topic:sa-*", "sub"),
                             ("allow", "group:ferry-spark-reader", "consume")),
    WRITER.access_key: rules(("allow", "topic:sa-*", "pub")),
}


@pytest.fixture(scope="module")
def auth_mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """namesrv and one broker with auth on; a topic holding COUNT messages."""
    with seeded_mesh(Mesh(etcd, tmp_path_factory.mktemp("spark-auth"), credentials=ADMIN,
                          namesrv_env={"FERRY_AUTH": "on"}, broker_env={"FERRY_AUTH": "on"}),
                     IDENTITIES) as mesh:
        yield mesh


@pytest.fixture
def no_env_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FERRY_ACCESS_KEY", raising=False)
    monkeypatch.delenv("FERRY_SECRET_KEY", raising=False)


def _topic(mesh: Mesh, messages: int) -> str:
    name = unique("sa")

    async def create() -> None:
        async with Admin(namesrv=mesh.namesrv, credentials=ADMIN) as admin:
            await admin.create_topic(name, queues=2)
    asyncio.run(create())
    if messages:
        asyncio.run(send_messages(mesh.namesrv, name, range(messages), credentials=ADMIN))
    return name


def _reader(spark, mesh: Mesh, topic: str, who=None):
    reader = spark.read.format("ferry").option("namesrv", mesh.namesrv).option("topic", topic)
    if who is not None:
        reader = reader.option("accessKey", who.access_key).option("secretKey", who.secret_key)
    return reader.load()


def _refused(action, error: str, secret: str = "") -> None:
    with pytest.raises(Exception) as info:
        action()
    text = str(info.value)
    assert error in text, text[-2000:]
    if secret:
        assert secret not in text


def test_read_with_sub_returns_the_rows(spark, auth_mesh: Mesh, no_env_identity) -> None:
    topic = _topic(auth_mesh, COUNT)
    df = _reader(spark, auth_mesh, topic, READER)
    assert df.count() == COUNT
    assert sorted(r.body for r in df.select("body").collect())[0].startswith(b"body-")
    plan = df._jdf.queryExecution().toString()
    assert READER.secret_key not in plan


def test_read_refused_without_credentials_or_sub(spark, auth_mesh: Mesh,
                                                 no_env_identity) -> None:
    topic = _topic(auth_mesh, COUNT)
    _refused(lambda: _reader(spark, auth_mesh, topic).count(), "AuthenticationError")
    _refused(lambda: _reader(spark, auth_mesh, topic, WRITER).count(), "AccessDeniedError",
             WRITER.secret_key)


def test_write_needs_pub(spark, auth_mesh: Mesh, no_env_identity) -> None:
    topic = _topic(auth_mesh, 0)
    df = spark.createDataFrame([(f"w-{i}",) for i in range(COUNT)], "body string")

    def write(who) -> None:
        df.write.format("ferry").option("namesrv", auth_mesh.namesrv).option("topic", topic) \
            .option("accessKey", who.access_key).option("secretKey", who.secret_key) \
            .mode("append").save()
    _refused(lambda: write(READER), "AccessDeniedError", READER.secret_key)
    write(WRITER)
    assert _reader(spark, auth_mesh, topic, READER).count() == COUNT


def test_half_a_key_pair_is_refused_at_load(spark, auth_mesh: Mesh) -> None:
    _refused(lambda: spark.read.format("ferry").option("namesrv", auth_mesh.namesrv)
             .option("topic", "sa-x").option("secretKey", READER.secret_key).load(),
             "accessKey and secretKey go together", READER.secret_key)
    _refused(lambda: spark.read.format("ferry").option("namesrv", auth_mesh.namesrv)
             .option("topic", "sa-x").option("accessKey", "reader")
             .option("secretKey", "short").load(), "secret key must have", "short")


def test_options_keep_the_secret_out_of_their_repr_and_ship_it_to_tasks() -> None:
    import pickle

    from ferry_spark.source.options import read_options, write_options
    given = {"namesrv": "h:1", "topic": "sa-x", "accessKey": READER.access_key,
             "secretKey": READER.secret_key}
    read, write = read_options(given, stream=False), write_options(given)
    for opts in (read, write):
        assert READER.secret_key not in repr(opts)
        shipped = pickle.loads(pickle.dumps(opts))   # what a task gets
        assert shipped.credentials == READER
        assert shipped.credentials.signing_key == READER.signing_key
