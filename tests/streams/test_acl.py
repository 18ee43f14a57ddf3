"""The stream door reference's Redis ACL rule for a tenant's producers and readers,
run as written (read out of docs/reference/streams.md, so the two cannot drift
apart) on the two Redis servers the service meets: the run's (7.x) and the
embedded one (6.2)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from app.bindings.names import full_name, tenant_prefix
from app.platform.settings import ROOT, Settings
from tests.conftest import RUN_ID

PAGE = ROOT / "docs" / "reference" / "streams.md"
TENANT, PREFIX = "acme", "streams"  # the page's tenant, under the default STREAMS_PREFIX


def documented_rules() -> dict[str, str]:
    """The page's `ACL SETUSER` lines, by the user each makes."""
    lines = [line.strip() for line in PAGE.read_text().splitlines()]
    rules = {line.split()[2]: line for line in lines if line.startswith("ACL SETUSER ")}
    assert set(rules) == {"acme-producer", "acme-reader"}, rules
    return rules


def password(rule: str) -> str:
    [secret] = [part[1:] for part in rule.split() if part.startswith(">")]
    return secret


@pytest.fixture(params=["run", pytest.param("embedded", marks=pytest.mark.processes)])
def server(request: pytest.FixtureRequest, settings: Settings) -> dict[str, Any]:
    """How to reach the server, less its database: the rule's users may not
    SELECT, so they (and these tests) use database 0, the default."""
    url = settings.redis_url if request.param == "run" else request.getfixturevalue(
        "embedded_redis"
    )  # fmt: skip
    kwargs = redis.Redis.from_url(url).connection_pool.connection_kwargs
    return {k: v for k, v in kwargs.items() if k in ("host", "port", "path", "unix_socket_path")}


def connect(server: dict[str, Any], **auth: str) -> redis.Redis:
    if "path" in server:
        return redis.Redis(unix_socket_path=server["path"], **auth)
    return redis.Redis(host=server["host"], port=server["port"], **auth)


def test_the_documented_acl_rule_keeps_producers_and_readers_in_their_tenants_logs(
    server: dict[str, Any],
) -> None:
    rules = documented_rules()
    # The rule's pattern is the prefix the service names the tenant's logs with.
    assert f"~{tenant_prefix(PREFIX, TENANT)}*" in rules["acme-producer"].split()
    assert Settings.model_fields["streams_prefix"].default == PREFIX
    requests = full_name(PREFIX, TENANT, f"requests-{RUN_ID}", "input")
    results = full_name(PREFIX, TENANT, f"results-{RUN_ID}", "output")
    others = [  # another tenant's, one whose name starts like acme's, and no tenant's
        full_name(PREFIX, "globex", f"results-{RUN_ID}", "output"),
        full_name(PREFIX, "acme:x", f"requests-{RUN_ID}", "input"),
        f"acl-test-{RUN_ID}",
    ]
    admin = connect(server)
    users = {name: f"{name}-{RUN_ID}" for name in rules}
    try:
        for name, rule in rules.items():  # each line as written, but for a user of this run
            admin.execute_command(*rule.replace(name, users[name], 1).split())
        producer = connect(server, username=users["acme-producer"],
                           password=password(rules["acme-producer"]))  # fmt: skip
        reader = connect(server, username=users["acme-reader"],
                         password=password(rules["acme-reader"]))  # fmt: skip

        # The producer appends to its tenant's logs, and nowhere else; it reads nothing.
        producer.xadd(requests, {"id": "r1", "inputs": '{"pixels": [[0]]}'})
        producer.xadd(results, {"id": "r1", "status": "succeeded"})  # the wildcard's reach
        for other in others:
            with pytest.raises(redis.exceptions.NoPermissionError):
                producer.xadd(other, {"id": "r1"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            producer.xrange(requests)
        assert admin.xlen(requests) == 1 and not any(admin.exists(o) for o in others)

        # The reader reads its tenant's output log as a reader does, and no other log.
        for other in others:
            admin.xadd(other, {"id": "theirs"})
        [(entry_id, fields)] = reader.xrange(results)
        assert fields == {b"id": b"r1", b"status": b"succeeded"}
        assert reader.xrevrange(results, count=1) == [(entry_id, fields)]
        assert reader.xlen(results) == 1
        assert reader.xread({results: "0"}) == [[results.encode(), [(entry_id, fields)]]]
        assert reader.xread({results: entry_id}, block=10) == []  # nothing after the last
        for other in others:
            for command in (["XRANGE", other, "-", "+"], ["XREAD", "STREAMS", other, "0"],
                            ["XLEN", other]):  # fmt: skip
                with pytest.raises(redis.exceptions.NoPermissionError):
                    reader.execute_command(*command)
        # It neither writes nor holds a group: nothing of its own to acknowledge.
        admin.xgroup_create(results, f"readers-{RUN_ID}", "0")
        for command in (["XADD", results, "*", "id", "forged"],
                        ["XGROUP", "CREATE", results, "mine", "0"],
                        ["XREADGROUP", "GROUP", f"readers-{RUN_ID}", "r", "STREAMS", results, ">"],
                        ["XACK", results, f"readers-{RUN_ID}", entry_id]):  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                reader.execute_command(*command)
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.execute_command("SELECT", "1")  # hence database 0 for the door's logs
    finally:
        for user in users.values():
            admin.execute_command("ACL", "DELUSER", user)
        admin.delete(requests, results, *others)
        admin.close()
