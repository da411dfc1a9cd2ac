"""Typed, layered settings shared by every component.

Each component declares one dataclass whose fields are built with ``option``.
From that single declaration come the command-line flags, the environment
variables (``ISRWATCH_<FIELD>``), the config file keys and docs/configuration.md
(kept true by a test). Layers, later wins: defaults, ``--config FILE`` (TOML,
keys as the field names, unknown keys are an error), environment, flags.

A command whose work spans components composes their settings with ``group``
(see ``isrwatch.commands``): each group stays its component's own dataclass,
while flags, environment and file keys stay flat (a name may appear in one group
only, checked when the command's settings are read).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from isrwatch.exceptions import ConfigError
from isrwatch.telemetry import MAX_CLUSTER_CHARS, MAX_TOPIC_CHARS

__all__ = ["option", "group", "build", "add_options", "load", "env_name", "flag_name", "describe", "Secret"]

T = TypeVar("T")


class Secret(str):
    """A string that never shows itself in logs or reprs."""

    def __repr__(self) -> str:
        return "Secret('****')"

    def __str__(self) -> str:  # the value is read with .reveal()
        return "****"

    def reveal(self) -> str:
        return str.__str__(self)


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    check: Callable[[Any], str | None] | None = None,
    metavar: str | None = None,
) -> Any:
    """A settings field. ``check`` returns an error text, or None when fine."""
    meta = {"help": help, "choices": choices, "check": check, "metavar": metavar}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type) -> Any:
    """A field holding another component's settings; its options join the command's."""
    return dataclasses.field(default_factory=cls, metadata={"group": cls})


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return "ISRWATCH_" + field.upper()


def _base_type(tp: Any) -> Any:
    """int for ``int | None``; list for ``list[str]``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])
    if origin is list:
        return list
    return tp


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    factory: Callable[[], Any] = f.default_factory  # type: ignore[assignment]
    return factory()


def _fields(cls: type) -> list[tuple[dataclasses.Field[Any], Any]]:
    """Every option of ``cls``, those of its groups included, in declaration order."""
    return [(f, tp) for _, f, tp in _leaves(cls)]


def _leaves(cls: type, owner: str = "") -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """(the declaring class, as module.Name; field; base type) per option, groups flattened."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, dataclasses.Field[Any], Any]] = []
    for f in dataclasses.fields(cls):
        sub = f.metadata.get("group")
        if sub is not None:
            out += _leaves(sub, f"{sub.__module__}.{sub.__qualname__}")
        else:
            out.append((owner or f"{cls.__module__}.{cls.__qualname__}", f, _base_type(hints[f.name])))
    seen: set[str] = set()
    for _, f, _ in out:
        if f.name in seen:
            raise TypeError(f"{cls.__name__}: option {f.name!r} is declared by two of its groups")
        seen.add(f.name)
    return out


def _construct(cls: type[T], values: Mapping[str, Any]) -> T:
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        sub = f.metadata.get("group")
        if sub is not None:
            kwargs[f.name] = _construct(sub, values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def _groups(settings: Any) -> list[Any]:
    """``settings`` and every group inside it, innermost first."""
    out = []
    for f in dataclasses.fields(settings):
        if f.metadata.get("group") is not None:
            out += _groups(getattr(settings, f.name))
    return [*out, settings]


def build(cls: type[T], **values: Any) -> T:
    """Settings of ``cls`` from option names (groups filled in by name), every check run.

    ``build(RunSettings, spool_dir=d, replica_series="not-ok")`` is what the flags
    ``--spool-dir d --replica-series not-ok`` give; an unknown name is a TypeError."""
    return _checked(cls, values, {})


def _checked(cls: type[T], values: Mapping[str, Any], where: Mapping[str, str]) -> T:
    """``build``, a failed check naming where its value came from (``where``: option name ->
    the flag, environment variable or config file key that set it; else the flag)."""
    names = {f.name for f, _ in _fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {unknown[0]!r}")
    settings = _construct(cls, values)
    for part in _groups(settings):
        for f in dataclasses.fields(part):
            check = f.metadata.get("check")
            if check is not None:
                problem = check(getattr(part, f.name))
                if problem:
                    raise ConfigError(f"{where.get(f.name, flag_name(f.name))}: {problem}")
        validate = getattr(part, "validate", None)
        if callable(validate):
            problem = validate()
            if problem:
                raise ConfigError(problem)
    return settings


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config`` and one flag per field of ``cls``."""
    parser.add_argument(
        "--config", metavar="FILE", default=argparse.SUPPRESS, help="TOML file with settings (keys as below, with _)"
    )
    for f, tp in _fields(cls):
        m = f.metadata
        default = _default(f)
        shown = "" if default in (None, "", []) else f" (default: {default})"
        text = f"{m['help']}{shown} [env {env_name(f.name)}]"
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        if tp is bool:
            parser.add_argument(flag_name(f.name), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if tp is list:
            kwargs["action"] = "append"
        if m["metavar"]:
            kwargs["metavar"] = m["metavar"]
        parser.add_argument(flag_name(f.name), **kwargs)


def _convert(name: str, where: str, tp: Any, raw: Any, choices: tuple[str, ...] | None) -> Any:
    if raw is None:
        return None
    try:
        if tp is bool:
            if isinstance(raw, bool):
                value: Any = raw
            elif str(raw).lower() in ("1", "true", "yes", "on"):
                value = True
            elif str(raw).lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError
        elif tp is list:
            items = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s]
            value = [str(s) for s in items]
        elif tp is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            value = int(raw)
        elif tp is float:
            value = float(raw)
        elif tp is Secret:
            value = Secret(str(raw))
        else:
            value = str(raw)
    except (TypeError, ValueError):
        kind = {bool: "true or false", int: "a whole number", float: "a number"}.get(tp, "text")
        raise ConfigError(f"{where}: {raw!r} is not {kind}") from None
    if choices and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of: {', '.join(choices)}")
    return value


def load(cls: type[T], args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> T:
    """Build settings from the layers and check every field."""
    env = os.environ if env is None else env
    ns = vars(args) if args is not None else {}
    fields = _fields(cls)
    names = {f.name for f, _ in fields}
    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # the layer that set each value, for the checks' messages

    path = ns.get("config") or env.get("ISRWATCH_CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as e:
            raise ConfigError(f"--config: cannot read {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--config: {path} is not valid TOML: {e}") from None
        except UnicodeDecodeError as e:  # TOML is UTF-8
            raise ConfigError(f"--config: {path} is not valid TOML: not UTF-8 (byte {e.start})") from None
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"--config: {path}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(names))}")
        for f, tp in fields:
            if f.name in data:
                where[f.name] = f"--config {path}: {f.name}"
                values[f.name] = _convert(f.name, where[f.name], tp, data[f.name], f.metadata["choices"])
    for f, tp in fields:
        if env_name(f.name) in env:
            where[f.name] = env_name(f.name)
            values[f.name] = _convert(f.name, where[f.name], tp, env[env_name(f.name)], f.metadata["choices"])
    for f, tp in fields:
        if f.name in ns:
            where[f.name] = flag_name(f.name)
            values[f.name] = _convert(f.name, where[f.name], tp, ns[f.name], f.metadata["choices"])

    return _checked(cls, values, where)


def describe(cls: type) -> list[dict[str, str]]:
    """One row per option: name, flag, env, default, help, and the settings class
    (component) that declares it (for the reference docs)."""
    rows = []
    for owner, f, _ in _leaves(cls):
        default = _default(f)
        rows.append(
            {
                "name": f.name,
                "flag": flag_name(f.name),
                "env": env_name(f.name),
                "default": "" if default is None else str(default),
                "help": f.metadata["help"],
                "declared_by": owner,
            }
        )
    return rows


def positive(v: Any) -> str | None:
    return None if v is None or v > 0 else f"{v} must be greater than 0"


def not_negative(v: Any) -> str | None:
    return None if v is None or v >= 0 else f"{v} must be 0 or more"


def http_url(v: str | None) -> str | None:
    """A base URL the job links or posts to: http or https with a host (``alertmanager:9093``
    without its scheme would fail at every post, and only in the log)."""
    if v is None:
        return None
    parsed = urllib.parse.urlsplit(v)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"{v!r} is not an http:// or https:// URL with a host (http://HOST[:PORT][/PATH])"
    try:
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return f"{v!r}: its port is not a number from 0 to 65535"
    return None


def port_number(v: int | None) -> str | None:
    """A port to listen on: 0 (any free one, where the option allows it) to 65535."""
    return None if v is None or 0 <= v <= 65535 else f"{v} is not a port (0 to 65535)"


def host_ports(v: str | None) -> str | None:
    """Bootstrap servers: comma-separated ``[PROTOCOL://]HOST[:PORT]`` items, each port a number
    from 1 to 65535 (``127.0.0.1:abc`` failed later, as a broker that cannot be reached). Given
    but empty is refused: ``ISRWATCH_BOOTSTRAP_SERVERS=`` (a deployment's unset variable) ran
    ``isrwatch run`` on its embedded simulator, its made-up alerts sent where real ones go."""
    if v is not None and not any(item.strip() for item in v.split(",")):
        return "empty: give HOST:PORT (several separated by commas), or leave the option out"
    for item in (v or "").split(","):
        address = item.strip().split("://", 1)[-1]
        if not address:
            continue
        if address.startswith("["):  # [IPv6]:PORT
            host, _, tail = address[1:].partition("]")
            port = tail[1:] if tail.startswith(":") else ("" if not tail else None)
        elif ":" in address:
            host, port = address.rsplit(":", 1)
        else:
            host, port = address, ""
        if not host or port is None or (port and not (port.isdigit() and 1 <= int(port) <= 65535)):
            return f"{item.strip()!r} is not HOST:PORT (a port from 1 to 65535; several separated by commas)"
    return None


def not_empty(v: str | None) -> str | None:
    """An option whose absence means a default (the job's embedded simulator), given but empty
    (a deployment's unset variable): refused, not taken for the absence."""
    return "empty: give a value, or leave the option out" if v is not None and not v.strip() else None


def http_urls(v: list[str]) -> str | None:
    """``http_url`` of each item of a repeatable option."""
    for item in v:
        problem = http_url(item)
        if problem:
            return problem
    return None


def cluster_name(v: str) -> str | None:
    """A cluster name the job accepts in telemetry (else every record is a dead letter)."""
    if not v:
        return "must not be empty (telemetry without a cluster is rejected: missing_cluster)"
    if len(v) > MAX_CLUSTER_CHARS:
        return f"{len(v)} characters, at most {MAX_CLUSTER_CHARS} (a longer one is rejected: name_too_long)"
    return None


_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


def topic_name(v: str) -> str | None:
    """A name Kafka accepts for a topic: 1 to 249 of letters, digits, ``.``, ``_``, ``-``,
    neither ``.`` nor ``..`` (otherwise every produce or read of it fails later)."""
    if not _TOPIC.fullmatch(v) or v in (".", ".."):
        return f"{v!r} is not a Kafka topic name (letters, digits, '.', '_' and '-' only)"
    if len(v) > MAX_TOPIC_CHARS:
        return f"{len(v)} characters, Kafka allows at most {MAX_TOPIC_CHARS}"
    return None


def kafka_config_pairs(items: list[str]) -> dict[str, str]:
    """``--kafka-config KEY=VALUE`` items as a dict; ConfigError on a bad item."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-config: {item!r} is not KEY=VALUE (for example security.protocol=SASL_SSL)")
        out[key.strip()] = value
    return out
