"""CURVE key files (docs/security.md, "CURVE"): making them, reading them, and the allowed-keys list.

Keys are ZeroMQ's own certificate files (zcert / `zmq.auth` format), so keys made by other ZeroMQ
tools work here and ours there:

    <name>.key          curve / public-key = "<40 Z85 chars>"                 (share it)
    <name>.key_secret   curve / public-key = "..." and secret-key = "..."     (mode 0600, keep it)

Wherever a key is configured, either the 40-character Z85 text itself or the path of such a file
may be given. An allowed-keys list is a file (one Z85 public key per line, `#` comments, or one
certificate) or a directory whose `*.key` files are each one client's public certificate.

Guarantees: every key returned is valid Z85 of 32 bytes; a bad file or value is one ConfigError
naming it; a secret file is created with mode 0600 from the start (never widened after).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from equeue_core.errors import ConfigError

Z85_KEY_LEN = 40
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_LINE = re.compile(r'^\s*(public-key|secret-key)\s*=\s*"(.{40})"\s*$')
_Z85 = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")


def _z85(where: str, text: str) -> str:
    if not _Z85.match(text):
        raise ConfigError(f"{where}: not a CURVE key (40 Z85 characters)")
    return text


def read_key_file(path: str | os.PathLike) -> tuple[str, str | None]:
    """(public key, secret key or None) of a certificate file; a file holding one bare Z85 line is a
    public key."""
    where = f"CURVE key file {path}"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: {e.strerror if isinstance(e, OSError) else e}") from None
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            found[m.group(1)] = _z85(where, m.group(2))
    if not found:
        bare = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if len(bare) == 1:
            return _z85(where, bare[0]), None
        raise ConfigError(f"{where}: no public-key line (expected a ZeroMQ certificate from `equeue keys generate`)")
    secret = found.get("secret-key")
    public = found.get("public-key") or (derive_public(secret) if secret else None)
    if public is None:
        raise ConfigError(f"{where}: no public-key line")
    if secret is not None and derive_public(secret) != public:
        raise ConfigError(f"{where}: its public-key does not belong to its secret-key")
    return public, secret


def _is_key_text(value: str) -> bool:
    return bool(_Z85.match(value)) and not os.path.exists(value)


def public_key(value: str, what: str = "CURVE public key") -> str:
    """A public key from its Z85 text or a key file (public or secret certificate)."""
    if _is_key_text(value):
        return value
    if not value:
        raise ConfigError(f"{what}: empty")
    return read_key_file(value)[0]


def key_pair(value: str, what: str = "CURVE secret key") -> tuple[str, str]:
    """(public, secret) from a secret certificate file or the secret key's Z85 text."""
    if _is_key_text(value):
        return derive_public(value), value
    public, secret = read_key_file(value)
    if secret is None:
        raise ConfigError(f"{what}: {value} holds only a public key (give the .key_secret file)")
    return public, secret


def derive_public(secret: str) -> str:
    import zmq

    try:
        return zmq.curve_public(secret.encode()).decode()
    except (zmq.ZMQError, ValueError) as e:
        raise ConfigError(f"not a CURVE secret key: {e}") from None


def allowed_keys(path: str) -> frozenset[str]:
    """The public keys in an allowed-keys file or directory (see the module docstring)."""
    p = Path(path)
    if p.is_dir():
        return frozenset(read_key_file(f)[0] for f in sorted(p.glob("*" + PUBLIC_SUFFIX)) if f.is_file())
    where = f"CURVE allowed-keys file {path}"
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: {e.strerror if isinstance(e, OSError) else e}") from None
    if any(_LINE.match(line) for line in text.splitlines()):
        return frozenset({read_key_file(p)[0]})
    return frozenset(_z85(f"{where}, line {i}", ln.strip()) for i, ln in enumerate(text.splitlines(), 1)
                     if ln.strip() and not ln.lstrip().startswith("#"))


def allowed_keys_version(path: str) -> tuple:
    """Changes whenever the allowed keys may have (a cheap stat, or a listing of a directory)."""
    try:
        st = os.stat(path)
        if os.path.isdir(path):
            return tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(path)
                                if e.name.endswith(PUBLIC_SUFFIX)))
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return ()


_HEADER = "#   ZeroMQ CURVE {kind} Certificate, made by `equeue keys generate`\n{note}\nmetadata\ncurve\n"


def generate(out_dir: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Write a new key pair as <name>.key (public, 0644) and <name>.key_secret (0600). Existing
    files are never overwritten (ConfigError)."""
    import zmq

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name):
        raise ConfigError(f"key name {name!r}: use 1-100 of [A-Za-z0-9_.-]")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    public, secret = (k.decode() for k in zmq.curve_keypair())
    pub_path, sec_path = out / (name + PUBLIC_SUFFIX), out / (name + SECRET_SUFFIX)
    for p in (pub_path, sec_path):
        if p.exists():
            raise ConfigError(f"{p} exists already: not overwriting a key (remove it or pick another --name)")
    _write(sec_path, 0o600, _HEADER.format(kind="**Secret**", note="#   Keep this file secret.\n")
           + f'    public-key = "{public}"\n    secret-key = "{secret}"\n')
    _write(pub_path, 0o644, _HEADER.format(kind="Public", note="#   Share this file.\n")
           + f'    public-key = "{public}"\n')
    return pub_path, sec_path


def _write(path: Path, mode: int, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ConfigError(f"{path} exists already: not overwriting a key") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # the umask may have narrowed the public file; never widens the secret
