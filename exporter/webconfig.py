"""``--web-config-file``: TLS and basic auth for ``/metrics`` and ``/runbook``, in the
web configuration format of Prometheus's exporter-toolkit (YAML):

```yaml
tls_server_config:
  cert_file: server.crt          # relative paths: to this file's directory
  key_file: server.key
  client_ca_file: ca.crt         # optional; then client_auth_type defaults to RequireAndVerifyClientCert
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS12             # optional: TLS10 .. TLS13
basic_auth_users:
  prometheus: $2b$12$...         # bcrypt hash (htpasswd -nBC 12 "" or python -m bcrypt)
```

With TLS the endpoint speaks HTTPS only; with users every request needs one of them
(401 and ``WWW-Authenticate`` otherwise). A file that is wrong in any way is a ConfigError
naming the file and the problem, at start-up. Passwords are never logged or kept.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import threading
from base64 import b64decode
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from isrwatch.exceptions import ConfigError

__all__ = ["WebConfig", "BasicAuth", "load_web_config", "web_config_problem"]

TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version")
# exporter-toolkit's client_auth_type values Python's ssl can honour (it cannot ask for a
# certificate without verifying it: RequestClientCert and RequireAnyClientCert).
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")
# Checked when the user is unknown, so an unknown user costs what a known one does (exporter-toolkit's way).
_DUMMY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
_CACHE_SIZE = 100


@dataclass(frozen=True)
class WebConfig:
    """A checked web configuration: ``ssl_context`` (None: plain HTTP) and ``users``
    (user -> bcrypt hash; empty: no authentication)."""

    path: str
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def wrap(self, app: Callable[..., Any]) -> Callable[..., Any]:
        """``app`` behind basic auth when the file names users; else ``app`` itself."""
        return BasicAuth(app, self.users) if self.users else app


class BasicAuth:
    """WSGI middleware: 401 unless the request carries a user's password. A successful
    check is cached per (user, password) (by digest, never the password), so a scrape
    every few seconds does not pay bcrypt's cost each time."""

    def __init__(self, app: Callable[..., Any], users: Mapping[str, bytes]) -> None:
        self.app = app
        self.users = dict(users)
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self.allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return self.app(environ, start_response)
        body = b"Unauthorized\n"
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Basic realm="isrwatch", charset="UTF-8"'),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]

    def allowed(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = hashlib.sha256(f"{len(user)}:{user}:{password}".encode()).digest()
        with self._lock:
            if key in self._ok:
                return True
        import bcrypt

        hashed = self.users.get(user)
        ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        if ok:
            with self._lock:
                if len(self._ok) >= _CACHE_SIZE:
                    self._ok.pop()
                self._ok.add(key)
        return ok


def load_web_config(path: str) -> WebConfig:
    """The file at ``path``, checked: ConfigError naming it and the problem."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        return WebConfig(path)  # an empty file: plain HTTP, no authentication, as exporter-toolkit
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with tls_server_config and/or basic_auth_users")
    _known(path, "", data, ("tls_server_config", "basic_auth_users"))
    base = os.path.dirname(os.path.abspath(path))
    context = _tls(path, base, data["tls_server_config"]) if data.get("tls_server_config") is not None else None
    return WebConfig(path, context, _users(path, data.get("basic_auth_users")))


def web_config_problem(path: str | None) -> str | None:
    """The ``option(check=...)`` form of ``load_web_config``: the problem, or None."""
    if not path:
        return None
    try:
        load_web_config(path)
    except ConfigError as e:
        return str(e)
    return None


def _known(path: str, where: str, data: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ConfigError(f"{path}: unknown key {where}{unknown[0]!r}; known keys: {', '.join(known)}")


def _tls(path: str, base: str, tls: Any) -> ssl.SSLContext:
    if not isinstance(tls, dict):
        raise ConfigError(f"{path}: tls_server_config must be a mapping")
    _known(path, "tls_server_config.", tls, TLS_KEYS)
    for key in ("cert_file", "key_file"):
        if not tls.get(key):
            raise ConfigError(f"{path}: tls_server_config.{key} is required")
    files = {k: os.path.join(base, str(tls[k])) for k in ("cert_file", "key_file", "client_ca_file") if tls.get(k)}
    for key, file in files.items():
        if not os.path.isfile(file):
            raise ConfigError(f"{path}: tls_server_config.{key}: {file} does not exist")
    auth = tls.get("client_auth_type") or (
        "RequireAndVerifyClientCert" if "client_ca_file" in files else "NoClientCert"
    )
    if auth not in CLIENT_AUTH:
        raise ConfigError(
            f"{path}: tls_server_config.client_auth_type: {auth!r} is not one of: {', '.join(CLIENT_AUTH)}"
        )
    if CLIENT_AUTH[auth] != ssl.CERT_NONE and "client_ca_file" not in files:
        raise ConfigError(f"{path}: tls_server_config.client_auth_type {auth} needs client_ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if tls.get(key) is not None:
            if tls[key] not in TLS_VERSIONS:
                raise ConfigError(f"{path}: tls_server_config.{key}: {tls[key]!r} is not one of: TLS10 .. TLS13")
            setattr(context, attr, TLS_VERSIONS[tls[key]])
    try:
        context.load_cert_chain(files["cert_file"], files["key_file"])
        if "client_ca_file" in files:
            context.load_verify_locations(files["client_ca_file"])
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(f"{path}: tls_server_config: cannot load the certificate, key or CA: {e}") from None
    context.verify_mode = CLIENT_AUTH[auth]
    return context


def _users(path: str, users: Any) -> dict[str, bytes]:
    if users is None:
        return {}
    if not isinstance(users, dict):
        raise ConfigError(f"{path}: basic_auth_users must be a mapping of user to bcrypt hash")
    out = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise ConfigError(f"{path}: basic_auth_users.{user}: not a bcrypt hash ($2b$<cost>$..., 60 characters)")
        out[str(user)] = hashed.encode()
    return out
