"""``--web-config-file``: the exporter-toolkit format read and refused as it should be, and
the server behind it speaking HTTPS only, with basic auth."""

from __future__ import annotations

import subprocess
from base64 import b64encode
from pathlib import Path

import bcrypt
import pytest
import requests

from exporter.server import serve
from exporter.settings import ExporterSettings
from exporter.store import StatusStore
from exporter.webconfig import BasicAuth, load_web_config
from isrwatch.exceptions import ConfigError
from isrwatch.settings import build
from tests.support.webconfig import PASSWORD, bcrypt_hash, web_config


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return web_config(tmp_path_factory.mktemp("web"))


def test_an_empty_file_is_plain_http_without_users(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("")
    config = load_web_config(str(tmp_path / "web.yml"))
    assert config.ssl_context is None and not config.users and config.scheme == "http"


def test_a_full_file_gives_tls_and_users(secured: Path) -> None:
    config = load_web_config(str(secured))
    assert config.ssl_context is not None and config.scheme == "https"
    assert set(config.users) == {"prometheus"}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  http2: true\n", "unknown key tls_server_config.'http2'"),
        ("basic_auth_user:\n  a: b\n", "unknown key 'basic_auth_user'"),
        ("tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n", "cert_file: .*missing.crt does not exist"),
        ("tls_server_config:\n  key_file: missing.key\n", "tls_server_config.cert_file is required"),
        ("basic_auth_users:\n  prometheus: plain-text-password\n", "basic_auth_users.prometheus: not a bcrypt hash"),
        ("basic_auth_users: [\n", "not valid YAML"),
        ("- a list\n", "expected a mapping"),
    ],
)  # fmt: skip
def test_a_wrong_file_is_one_line_naming_the_file_and_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as caught:
        load_web_config(str(path))
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


def test_the_settings_refuse_a_wrong_file_at_start_up(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("basic_auth_users:\n  prometheus: hunter2\n")
    with pytest.raises(ConfigError, match=f"^--web-config-file: {path}: basic_auth_users.prometheus") as caught:
        build(ExporterSettings, bootstrap_servers="k:9092", web_config_file=str(path))
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read"):
        build(ExporterSettings, bootstrap_servers="k:9092", web_config_file=str(tmp_path / "none.yml"))


def test_a_successful_check_is_cached_and_a_wrong_password_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, hashed: calls.append(1) or real(pw, hashed))
    auth = BasicAuth(lambda environ, start: [b""], {"prometheus": bcrypt_hash(PASSWORD).encode()})
    good = "Basic " + b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    bad = "Basic " + b64encode(b"prometheus:wrong").decode()
    assert [auth.allowed(good) for _ in range(3)] == [True] * 3
    assert len(calls) == 1
    assert not auth.allowed(bad) and not auth.allowed(bad)
    assert len(calls) == 3
    stranger = "Basic " + b64encode(f"stranger:{PASSWORD}".encode()).decode()
    assert not auth.allowed(stranger) and not auth.allowed("Bearer x") and not auth.allowed("Basic !!")


def test_the_server_speaks_https_only_and_asks_for_the_password(secured: Path) -> None:
    config = load_web_config(str(secured))
    cert = str(secured.parent / "server.crt")
    with serve(StatusStore(), "127.0.0.1", 0, web_config=config) as server:
        assert server.url.startswith("https://")
        ok = requests.get(server.url, auth=("prometheus", PASSWORD), verify=cert, timeout=5)
        assert ok.status_code == 200 and "isrwatch_" in ok.text
        runbook = requests.get(server.url.replace("/metrics", "/runbook"), verify=cert, timeout=5)
        assert runbook.status_code == 401
        wrong = requests.get(server.url, auth=("prometheus", "wrong"), verify=cert, timeout=5)
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith("Basic")
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{server.port}/metrics", auth=("prometheus", PASSWORD), timeout=5)
        # the server still answers after a plain-HTTP attempt
        assert requests.get(server.url, auth=("prometheus", PASSWORD), verify=cert, timeout=5).status_code == 200


def test_the_job_links_its_runbook_over_https_when_it_serves_tls(secured: Path, tmp_path: Path) -> None:
    from streaming.driver.endpoints import runbook_base
    from streaming.settings import AlertingSettings, JobSettings

    tls = JobSettings(web_config_file=str(secured))
    assert runbook_base(AlertingSettings(), tls, 9744) == "https://127.0.0.1:9744/runbook"
    users_only = web_config(tmp_path, tls=False)
    plain = JobSettings(web_config_file=str(users_only))
    assert runbook_base(AlertingSettings(), plain, 9744) == "http://127.0.0.1:9744/runbook"


def _signed_client(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a client certificate and key it signed (openssl CLI)."""
    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
    key, csr, cert = directory / "client.key", directory / "client.csr", directory / "client.crt"

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", str(ca_key), "-out", str(ca_cert))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=prometheus", "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "1", "-out", str(cert))  # fmt: skip
    return ca_cert, cert, key


def test_a_client_ca_requires_a_certificate_it_signed(tmp_path: Path) -> None:
    config = web_config(tmp_path, users=False)
    ca_cert, client_cert, client_key = _signed_client(tmp_path)
    config.write_text(config.read_text() + "  client_ca_file: ca.crt\n")  # client_auth_type defaults to require
    web = load_web_config(str(config))
    server_cert = str(tmp_path / "server.crt")
    with serve(StatusStore(), "127.0.0.1", 0, web_config=web) as server:
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(server.url, verify=server_cert, timeout=5)
        ok = requests.get(server.url, verify=server_cert, cert=(str(client_cert), str(client_key)), timeout=5)
        assert ok.status_code == 200


def test_a_verifying_client_auth_type_without_a_ca_is_refused(tmp_path: Path) -> None:
    config = web_config(tmp_path, users=False)
    config.write_text(config.read_text() + "  client_auth_type: RequireAnyClientCert\n")
    with pytest.raises(ConfigError, match="client_auth_type: 'RequireAnyClientCert' is not one of"):
        load_web_config(str(config))
    config.write_text(config.read_text().replace("RequireAnyClientCert", "RequireAndVerifyClientCert"))
    with pytest.raises(ConfigError, match="needs client_ca_file"):
        load_web_config(str(config))
