"""The two ACL accounts the name-server and controller security tests share: an admin (what
brokers register, heartbeat and copy as) and an application account that may send and consume
everything but is not an admin."""

from __future__ import annotations

ROOT = ("root", "root-secret-0001")
APP = ("app", "app-secret-0001")
ACL = f"""
[[accounts]]
access_key = "{ROOT[0]}"
secret_key = "{ROOT[1]}"
topics = ["*"]
groups = ["*"]
admin = true

[[accounts]]
access_key = "{APP[0]}"
secret_key = "{APP[1]}"
topics = ["*"]
groups = ["*"]
"""
