"""Registers the `acl` authorizer (config `acl = true` + `acl_file`, or `authorizer = "acl"`)."""

from __future__ import annotations

import pluggy
from equeue_plugins.auth_acl.authorizer import AclAuthorizer

hookimpl = pluggy.HookimplMarker("equeue")


@hookimpl
def equeue_authorizers() -> dict:
    return {"acl": AclAuthorizer.from_config}
