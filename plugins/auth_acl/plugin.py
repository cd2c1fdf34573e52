"""Registers the `acl` authorizer (config `acl = true` + `acl_file`, or `authorizer = "acl"`)."""

from __future__ import annotations

from equeue_core.hookspecs import hookimpl
from equeue_core.import_on_call import ImportOnCall


@hookimpl
def equeue_authorizers() -> dict:
    return {"acl": ImportOnCall("equeue_plugins.auth_acl.authorizer:AclAuthorizer.from_config")}
