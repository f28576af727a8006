"""namesrv's auto-create with FERRY_AUTH=on is bounded (issue 24): per identity and in all,
on a real namesrv and broker over etcd; other identities keep working past one's limit."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import BusyError

from tests.broker.auth_support import ADMIN_RULES, creds, rules, seeded_mesh
from tests.client.conftest import Mesh
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDENTITIES = {
    "root": ADMIN_RULES,
    "spammer": rules(("allow", "topic:*", "pub")),
    "other": rules(("allow", "topic:*", "pub")),
    "late": rules(("allow", "topic:*", "pub")),
}


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with seeded_mesh(Mesh(etcd, tmp_path_factory.mktemp("topic-quota"),
                          broker_env={"FERRY_AUTH": "on"},
                          namesrv_env={"FERRY_AUTH": "on", "FERRY_NAMESRV_MAX_TOPICS": "5",
                                       "FERRY_NAMESRV_MAX_TOPICS_PER_IDENTITY": "3"},
                          credentials=creds("root")), IDENTITIES) as mesh:
        yield mesh


async def test_auto_create_stops_per_identity_and_in_all(mesh: Mesh) -> None:
    clients = {key: NamesrvClient(mesh.namesrv, credentials=creds(key))
               for key in ("spammer", "other", "late")}
    try:
        for i in range(3):
            route = await clients["spammer"].get_route(f"spam-{i}", create=True)
            assert route.topic == f"spam-{i}"
        with pytest.raises(BusyError, match="MAX_TOPICS_PER_IDENTITY"):
            await clients["spammer"].get_route("spam-3", create=True)
        await clients["spammer"].get_route("spam-0", create=True)   # exists: answered
        await clients["other"].get_route("other-0", create=True)    # others keep creating
        await clients["other"].get_route("other-1", create=True)
        with pytest.raises(BusyError, match=r"\(MAX_TOPICS\)"):
            await clients["late"].get_route("late-0", create=True)   # etcd holds 5 topics
        await clients["late"].get_route("other-1", create=True)
    finally:
        for client in clients.values():
            await client.close()
