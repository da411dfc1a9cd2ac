"""Web configuration files (exporter-toolkit format) for the tests: a fresh self-signed
certificate for 127.0.0.1 made with the openssl CLI, users with bcrypt hashes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import bcrypt

__all__ = ["PASSWORD", "USER", "bcrypt_hash", "self_signed", "web_config"]

USER = "prometheus"
PASSWORD = "s3cret-scrape"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """``server.crt`` for 127.0.0.1 and ``server.key`` in ``directory``."""
    cert, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def web_config(directory: Path, *, tls: bool = True, users: bool = True) -> Path:
    """``directory/web.yml``: TLS with a fresh self-signed certificate (paths relative to the
    file, as exporter-toolkit reads them) and user ``USER`` with ``PASSWORD``."""
    lines = []
    if tls:
        self_signed(directory)
        lines += ["tls_server_config:", "  cert_file: server.crt", "  key_file: server.key"]
    if users:
        lines += ["basic_auth_users:", f"  {USER}: '{bcrypt_hash(PASSWORD)}'"]
    path = directory / "web.yml"
    path.write_text("\n".join(lines) + "\n")
    return path
