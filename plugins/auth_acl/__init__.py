"""The built-in ACL authorizer: accounts in a TOML file, HMAC-signed requests (docs/security.md)."""
