"""``--kafka-config`` (librdkafka property names) for both Kafka clients of the collector.

confluent-kafka takes the properties as they are. kafka-python, used for the
protocol-level requests, has its own names: this module translates the ones
that matter for reaching a cluster (security, SASL, SSL, client id, timeouts,
the broker version when ``api.version.request=false``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any

from isrwatch.exceptions import ConfigError
from isrwatch.logs import kv
from isrwatch.settings import kafka_config_pairs

__all__ = [
    "kafka_python_config",
    "librdkafka_config",
    "broker_version",
    "protocol_client_problem",
    "kafka_config_problem",
]

log = logging.getLogger(__name__)

# librdkafka name -> kafka-python name (values copied as strings unless converted below)
_RENAMES = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
    "ssl.cipher.suites": "ssl_ciphers",
    "client.id": "client_id",
}
_INTS = {
    "request.timeout.ms": "request_timeout_ms",
    "socket.connection.setup.timeout.ms": "socket_connection_setup_timeout_ms",
    "reconnect.backoff.ms": "reconnect_backoff_ms",
    "reconnect.backoff.max.ms": "reconnect_backoff_max_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
}
# librdkafka settings with no meaning for a protocol-level client: dropped quietly.
_HANDLED_ELSEWHERE = {
    "api.version.request",
    "broker.version.fallback",
    "enable.ssl.certificate.verification",
    "ssl.endpoint.identification.algorithm",
    "bootstrap.servers",
}

# Credentials and trust that kafka-python has no way to take: given only these, the
# protocol-level client could not connect where the librdkafka clients do.
_UNUSABLE = {
    "ssl.keystore.location": "a PKCS#12 keystore",
    "ssl.keystore.password": "a PKCS#12 keystore",
    "ssl.certificate.pem": "an inline PEM certificate",
    "ssl.key.pem": "an inline PEM key",
    "ssl.ca.pem": "an inline PEM CA",
    "ssl.ca.certificate.stores": "a Windows certificate store",
    "ssl.engine.location": "an OpenSSL engine",
    "ssl.engine.id": "an OpenSSL engine",
    "ssl.providers": "OpenSSL providers",
}
_USABLE_MECHANISMS = {"PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512"}


def protocol_client_problem(props: Mapping[str, Any]) -> str | None:
    """Why librdkafka properties cannot reach a cluster through kafka-python, or None.

    isrwatch's protocol-level requests (the collector's probe, the job's planner) go
    through kafka-python, so settings only librdkafka can use are refused at start-up
    rather than leaving those requests to fail on every round. Names keys, never values."""
    unusable = sorted(k for k in props if k in _UNUSABLE or k.startswith("sasl.oauthbearer."))
    if unusable:
        what = sorted({_UNUSABLE.get(k, "OAUTHBEARER token settings") for k in unusable})
        return (
            f"--kafka-config {', '.join(unusable)}: isrwatch's protocol-level client (kafka-python: the collector's "
            f"probe, the job's planner) cannot use {' or '.join(what)}; give the certificate, key and CA as PEM "
            "files (ssl.certificate.location, ssl.key.location, ssl.key.password, ssl.ca.location): "
            'docs/kafka.md, "Pointing at a production cluster"'
        )
    mechanisms = {str(props[k]).upper() for k in ("sasl.mechanism", "sasl.mechanisms") if k in props}
    if mechanisms - _USABLE_MECHANISMS:
        return (
            f"--kafka-config sasl.mechanism={', '.join(sorted(mechanisms - _USABLE_MECHANISMS))}: isrwatch's "
            f"protocol-level client (kafka-python) supports {', '.join(sorted(_USABLE_MECHANISMS))} "
            'from settings: docs/kafka.md, "Pointing at a production cluster"'
        )
    return None


def kafka_config_problem(items: list[str]) -> str | None:
    """``protocol_client_problem`` of ``--kafka-config KEY=VALUE`` items, or the items' own
    error (not KEY=VALUE): the settings' start-up check for the job and the collector."""
    try:
        props = kafka_config_pairs(items)
        if "broker.version.fallback" in props:
            broker_version(props["broker.version.fallback"])
        return protocol_client_problem(props)
    except ConfigError as e:
        return str(e)


def broker_version(text: str) -> tuple[int, ...]:
    """``broker.version.fallback`` as kafka-python's api_version: 0.9.0.1 -> (0, 9); 0.10.2.1 -> (0, 10, 2); 2.8.1 -> (2, 8).
    ConfigError (one line) for a version kafka-python records no ranges of (4.1.0 with kafka-python 2.3)."""
    from kafka.protocol.broker_api_versions import BROKER_API_VERSIONS

    try:
        parts = [int(p) for p in text.strip().split(".")]
    except ValueError:
        raise ConfigError(f"--kafka-config broker.version.fallback={text!r} is not a version like 0.9.0.1") from None
    if not parts:
        raise ConfigError("--kafka-config broker.version.fallback is empty")
    if parts[0] == 0 and len(parts) >= 2 and parts[1] >= 10:
        version = tuple((parts + [0, 0])[:3])
    else:
        version = tuple((parts + [0])[:2])
    if version not in BROKER_API_VERSIONS and version + (0,) in BROKER_API_VERSIONS:
        version += (0,)
    if version not in BROKER_API_VERSIONS:
        known = sorted(BROKER_API_VERSIONS)
        raise ConfigError(
            f"--kafka-config broker.version.fallback={text}: isrwatch's protocol client (kafka-python) knows brokers "
            f"{'.'.join(map(str, known[0]))} to {'.'.join(map(str, known[-1]))} only; it asks every broker its versions "
            "(ApiVersions) and uses the fallback only for one that cannot answer (Kafka 0.9): give 0.9.0.1, or leave it out"
        )
    return version


def librdkafka_config(bootstrap_servers: str, props: Mapping[str, str], **extra: Any) -> dict[str, Any]:
    """Settings for a confluent-kafka client: the user's properties, then bootstrap servers and ``extra``."""
    return {**props, "bootstrap.servers": bootstrap_servers, **extra}


def kafka_python_config(bootstrap_servers: str, props: Mapping[str, Any], quiet: bool = False) -> dict[str, Any]:
    """Keyword arguments for kafka-python's KafkaClient from librdkafka properties.

    Security settings it cannot translate are logged as a warning, or at debug level when
    ``quiet`` (a caller that asks often, and has a librdkafka client beside it)."""
    out: dict[str, Any] = {"bootstrap_servers": bootstrap_servers.split(","), "client_id": "isrwatch-collector"}
    ignored = []
    for key, value in props.items():
        if key in _RENAMES:
            out[_RENAMES[key]] = value
        elif key in _INTS:
            try:
                out[_INTS[key]] = int(value)
            except ValueError:
                raise ConfigError(f"--kafka-config {key}={value!r} is not a whole number") from None
        elif key not in _HANDLED_ELSEWHERE:
            ignored.append(key)
    if "security_protocol" in out:
        out["security_protocol"] = str(out["security_protocol"]).upper()
    if "sasl_mechanism" in out:
        out["sasl_mechanism"] = str(out["sasl_mechanism"]).upper()
    if str(props.get("api.version.request", "true")).lower() == "false":
        out["api_version"] = broker_version(props.get("broker.version.fallback", "0.9.0.1"))
    if str(props.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        out["ssl_check_hostname"] = False
    if str(props.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        ctx = ssl.create_default_context(cafile=out.get("ssl_cafile"))
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if out.get("ssl_certfile"):
            ctx.load_cert_chain(out["ssl_certfile"], out.get("ssl_keyfile"), out.get("ssl_password"))
        out["ssl_context"] = ctx
        out["ssl_check_hostname"] = False
    security = [k for k in ignored if k.startswith(("ssl.", "sasl.", "security."))]
    if security and not quiet:
        log.warning(kv(event="kafka_config_not_translated", client="kafka-python", keys=",".join(sorted(security))))
    elif ignored:
        log.debug(kv(event="kafka_config_not_translated", client="kafka-python", keys=",".join(sorted(ignored))))
    return out
