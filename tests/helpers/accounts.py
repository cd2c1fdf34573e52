"""ACL accounts for the security tests, written as the auth_acl plugin's TOML.

`ACL` holds the two accounts the name-server and controller security tests share: an admin (what
brokers register, heartbeat and copy as) and an application account that may send and consume
everything but is not an admin. `account()` writes one more for a test that needs narrower rights."""

from __future__ import annotations

ROOT = ("root", "root-secret-0001")
APP = ("app", "app-secret-0001")


def account(key: tuple[str, str], topics: list[str] | None = None, groups: list[str] | None = None,
            admin: bool = False, addresses: list[str] | None = None) -> str:
    """One [[accounts]] table: `key` is (access_key, secret_key); topics and groups default to all."""
    lines = ["[[accounts]]", f'access_key = "{key[0]}"', f'secret_key = "{key[1]}"',
             f"topics = {list(topics or ['*'])}".replace("'", '"'),
             f"groups = {list(groups or ['*'])}".replace("'", '"')]
    if admin:
        lines.append("admin = true")
    if addresses is not None:
        lines.append(f"addresses = {list(addresses)}".replace("'", '"'))
    return "\n".join(lines) + "\n"


ADMIN_ONLY = account(ROOT, admin=True)
ACL = ADMIN_ONLY + "\n" + account(APP)
