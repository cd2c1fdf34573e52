"""Registers the `acl` authorizer (config `acl = true` + `acl_file`, or `authorizer = "acl"`)."""

from __future__ import annotations

from equeue_plugins.auth_acl.authorizer import AclAuthorizer

from equeue_core.hookspecs import hookimpl


@hookimpl
def equeue_authorizers() -> dict:
    return {"acl": AclAuthorizer.from_config}
