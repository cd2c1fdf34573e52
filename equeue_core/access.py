"""What each request needs from an account (docs/security.md, "What each request needs").

Shared by every authorizer, so a site's own (LDAP, ...) decides on the same table as the built-in
ACL one. Modelled on RocketMQ's PlainAccessValidator: sends need the topic, everything a consumer
does needs its group, operator requests need admin; an unknown code needs admin (deny by default).
"""

from __future__ import annotations

from typing import Any

from equeue_core.codes import Code

ANY = "any"        # any account with a valid signature
TOPIC = "topic"    # the header's `topic` must be in the account's send rights
GROUP = "group"    # the header's `group` must be in the account's consume rights
ADMIN = "admin"    # the account must be an admin

ADMIN_READER_GROUP = "%ADMIN%"

NEEDS: dict[int, str] = {
    Code.SEND: TOPIC,
    Code.SEND_MULTI: TOPIC,     # every section's topic (a tuple of names, see needs)
    Code.ROUTE: ANY,            # TOPIC when it asks to create the topic
    Code.PULL: GROUP,
    Code.PULL_MULTI: GROUP,
    Code.COMMIT_OFFSETS: GROUP,
    Code.QUERY_OFFSET: GROUP,
    Code.HEARTBEAT: GROUP,
    Code.UNREGISTER: GROUP,
    Code.GROUP_MEMBERS: GROUP,
    Code.SEND_BACK: GROUP,
    Code.LOCK_QUEUES: GROUP,
    Code.UNLOCK_QUEUES: GROUP,
    Code.BROKER_INFO: ANY,
    Code.OFFSET_FOR_TIME: ANY,
    Code.QUEUE_RANGES: ANY,
    Code.CREATE_TOPIC: ADMIN,
    Code.LIST_TOPICS: ADMIN,
    Code.GET_MESSAGE: ADMIN,
    Code.GROUP_INFO: ADMIN,
    Code.RESET_OFFSETS: ADMIN,
    Code.DELETE_TOPIC: ADMIN,
    Code.QUERY_BY_KEY: ADMIN,
    Code.BROKER_STATS: ADMIN,
    Code.SKIP_RECORD: ADMIN,
    # name server (docs/cluster.md): only brokers register, and they sign as an admin account
    Code.REGISTER_BROKER: ADMIN,
    Code.UNREGISTER_BROKER: ADMIN,
    Code.GET_ROUTE: ANY,
    Code.GET_CLUSTER_INFO: ANY,
    Code.NAMESERVER_INFO: ANY,
    # replication (docs/replication.md): a replica signs its link to the master as an admin account
    Code.REPL_HELLO: ADMIN,
    Code.REPL_FETCH: ADMIN,
    Code.REPL_EPOCHS: ADMIN,
    Code.REPL_SYNC_META: ADMIN,
    Code.REPL_STATUS: ADMIN,
    Code.REPL_PROMOTE: ADMIN,
    Code.REPL_DEMOTE: ADMIN,
    # controller (docs/controller.md): brokers heartbeat as an admin account, as they register
    Code.CONTROLLER_HEARTBEAT: ADMIN,
    Code.ELECT_MASTER: ADMIN,
    Code.CONTROLLER_INFO: ANY,
}


def request_name(code: int) -> str:
    try:
        return Code(code).name.lower()
    except ValueError:
        return f"code {code}"


def needs(code: int, header: dict[str, Any]) -> tuple[str, Any]:
    """(kind of right, the resource it is about): ("topic", name), ("group", name), ("admin", None)
    or ("any", None). A missing or non-string resource is returned as is; the authorizer refuses it.
    A SEND_MULTI needs every topic it writes: ("topic", (name, ...)), each named once, in the
    order of the sections (None when `sections` is malformed: refused)."""
    kind = NEEDS.get(code, ADMIN)
    if code == Code.SEND_MULTI:
        return kind, multi_send_topics(header)
    if code in (Code.PULL, Code.PULL_MULTI) and header.get("group") == ADMIN_READER_GROUP:
        kind = ADMIN  # AdminClient.read_queue: inspecting any queue (DLQs, `equeue message`) is admin
    if code == Code.ROUTE and header.get("create"):
        kind = TOPIC
    if kind == TOPIC:
        return kind, header.get("topic")
    if kind == GROUP:
        return kind, header.get("group")
    return kind, None


def multi_send_topics(header: dict[str, Any]) -> tuple[str, ...] | None:
    """The topics of a SEND_MULTI's sections, each once, in order; None when `sections` is not a
    list of [topic: str, ...] entries (the authorizer refuses it; the broker would too)."""
    sections = header.get("sections")
    if type(sections) is not list or not sections:
        return None
    topics: dict[str, None] = {}
    for section in sections:
        if type(section) is not list or not section or type(section[0]) is not str:
            return None
        topics[section[0]] = None
    return tuple(topics)
