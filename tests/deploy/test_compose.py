"""docker-compose.yml and deploy/Dockerfile, checked statically (no Docker here):
referenced files exist, every isrwatch command line is valid, ports do not
clash, images are pinned, and the services point at each other correctly."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import tomllib
from typing import Any

import pytest
import yaml

from isrwatch.cli import COMMANDS, build_parser
from isrwatch.settings import load
from tests.deploy.panels import DEPLOY, REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def _argv(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def isrwatch_services() -> dict[str, list[str]]:
    """Services running the isrwatch image, with their isrwatch argv (Spark's own daemons,
    from the same image, are ``spark_services``)."""
    out = {}
    for name, svc in services().items():
        if name in spark_services():
            continue
        if "build" in svc or str(svc.get("image", "")).startswith("isrwatch:"):
            entry = _argv(svc.get("entrypoint"))
            assert not entry or entry == ["isrwatch"], f"{name}: the image's entrypoint is isrwatch"
            out[name] = _argv(svc.get("command"))
    return out


def spark_services() -> dict[str, list[str]]:
    """Services running Spark's standalone daemons (``spark-class``), with their argv."""
    return {
        name: _argv(svc.get("command"))
        for name, svc in services().items()
        if _argv(svc.get("entrypoint")) == ["spark-class"]
    }


def _parse(argv: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(f"isrwatch {' '.join(argv)}: {err.getvalue().strip()}") from None


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_compose_parses_with_the_expected_services() -> None:
    names = set(services())
    assert {
        "kafka1",
        "kafka2",
        "kafka3",
        "collector",
        "job",
        "exporter",
        "prometheus",
        "alertmanager",
        "grafana",
    } <= names
    demo = {n for n, s in services().items() if "demo" in s.get("profiles", [])}
    assert {"loadgen", "fault"} <= demo
    # The core stack starts without the demo profile.
    assert not demo & {"kafka1", "collector", "job", "exporter", "prometheus", "alertmanager", "grafana"}


def test_images_are_pinned() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, svc in services().items():
        image = svc.get("image")
        assert image, f"{name}: no image"
        repo, sep, tag = image.rpartition(":")
        assert sep and repo and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned to a version"
        if "build" in svc:
            assert tag == version, f"{name}: built image {image} should carry the project version {version}"


def test_referenced_files_exist() -> None:
    for name, svc in services().items():
        build = svc.get("build")
        if build:
            context = REPO / (build if isinstance(build, str) else build.get("context", "."))
            assert context.is_dir(), f"{name}: build context {context}"
            if isinstance(build, dict) and "dockerfile" in build:
                assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name}: mounts missing {source}"
            elif not source.startswith("/"):
                assert source in (compose().get("volumes") or {}), f"{name}: undeclared volume {source}"


def _on_the_host(name: str, argv: list[str]) -> list[str]:
    """``argv`` with each path the service mounts from the repository (``./x:/in/container``)
    replaced by the repository's file, so the checks read what the container would."""
    mounts = {}
    for volume in services()[name].get("volumes", []):
        if isinstance(volume, str) and volume.startswith("."):
            source, target = volume.split(":")[:2]
            mounts[target] = str(REPO / source)
    return [mounts.get(a, a) for a in argv]


def test_isrwatch_commands_are_valid() -> None:
    commands = isrwatch_services()
    assert {argv[0] for argv in commands.values()} >= {"collect", "run", "exporter"}
    for name, argv in commands.items():
        args = _parse(_on_the_host(name, argv))
        _, settings_path, _ = COMMANDS[args.command]
        module, _, cls_name = settings_path.partition(":")
        cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        env = {k: str(v) for k, v in (services()[name].get("environment") or {}).items()}
        load(cls, args, env=env)  # runs every check and validate(): ConfigError fails the test


def test_the_job_and_the_exporter_serve_as_the_mounted_web_config_says() -> None:
    commands = isrwatch_services()
    for name in ("job", "exporter"):
        path = _flag(commands[name], "--web-config-file")
        assert path, f"{name}: no --web-config-file"
        mounted = _on_the_host(name, [path])[0]
        assert mounted != path and mounted.endswith("deploy/web-config.yml"), f"{name}: {path} is not mounted"


def test_a_bad_command_would_be_caught() -> None:
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        _parse(["run", "--no-such-flag"])


def test_host_ports_do_not_clash() -> None:
    seen: dict[int, str] = {}
    for name, svc in services().items():
        for port in svc.get("ports", []):
            parts = str(port).split(":")
            assert len(parts) >= 2, f"{name}: {port} publishes a random host port; pin it"
            host = int(parts[-2])
            assert host not in seen, f"host port {host}: {seen.get(host)} and {name}"
            seen[host] = name


def test_depends_on_existing_services() -> None:
    names = set(services())
    for name, svc in services().items():
        deps = svc.get("depends_on") or []
        assert set(deps) <= names, f"{name}: depends on {set(deps) - names}"


def _kafka_internal_endpoints() -> set[str]:
    out = set()
    for svc in services().values():
        env = svc.get("environment") or {}
        listeners = str(env.get("KAFKA_ADVERTISED_LISTENERS", ""))
        out |= {m.group(1) for m in re.finditer(r"INTERNAL://([\w.-]+:\d+)", listeners)}
    return out


def test_kafka_is_kraft_with_three_brokers() -> None:
    brokers = {n: s["environment"] for n, s in services().items() if "KAFKA_NODE_ID" in (s.get("environment") or {})}
    assert len(brokers) == 3
    assert len({env["KAFKA_NODE_ID"] for env in brokers.values()}) == 3
    for env in brokers.values():
        assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
        voters = {v.split("@")[0] for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")}
        assert voters == {str(e["KAFKA_NODE_ID"]) for e in brokers.values()}
        assert "CLUSTER_ID" in env
    for name in brokers:
        assert services()[name]["image"].startswith("apache/kafka:")


def test_isrwatch_services_point_at_the_brokers_and_each_other() -> None:
    endpoints = _kafka_internal_endpoints()
    assert len(endpoints) == 3
    commands = isrwatch_services()
    for name, argv in commands.items():
        servers = _flag(argv, "--bootstrap-servers")
        assert servers, f"{name}: no --bootstrap-servers"
        assert set(servers.split(",")) <= endpoints, f"{name}: {servers} are not the brokers' listeners"
    job = commands["job"]
    # Alerts go to the compose Alertmanager, on the port Prometheus also uses.
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    am_targets = {t for am in prom["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]}
    assert _flag(job, "--alertmanager-url") in {f"http://{t}" for t in am_targets}
    assert set(am_targets) <= {f"{n}:9093" for n, s in services().items() if s["image"].startswith("prom/alertmanager")}
    # The job's replica.lag.time.max.ms is the brokers'.
    lag = {
        str(s["environment"]["KAFKA_REPLICA_LAG_TIME_MAX_MS"])
        for s in services().values()
        if "KAFKA_NODE_ID" in (s.get("environment") or {})
    }
    assert lag == {_flag(job, "--lag-time-max-ms")}


def test_prometheus_scrapes_the_isrwatch_services() -> None:
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for sc in prom["scrape_configs"] for c in sc["static_configs"] for t in c["targets"]}
    commands = isrwatch_services()
    listening = {
        "exporter": (_flag(commands["exporter"], "--port") or "9743"),
        "job": (_flag(commands["job"], "--metrics-port") or "9743"),
    }
    for name, port in listening.items():
        assert f"{name}:{port}" in targets
    # Reachable from other containers: not bound to loopback inside the container.
    assert _flag(commands["job"], "--metrics-host") == "0.0.0.0"
    assert _flag(commands["exporter"], "--host") in (None, "0.0.0.0")
    for target in targets:
        host = target.split(":")[0]
        assert host == "localhost" or host in services(), f"scrape target {target}: no such service"
    mounts = services()["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    assert "./deploy/prometheus/rules:/etc/prometheus/rules:ro" in mounts
    assert prom["rule_files"] == ["rules/*.yml"]


def test_demo_fault_has_a_target() -> None:
    fault = " ".join(_argv(services()["fault"]["command"]))
    label = re.search(r"label=([\w.-]+)=true", fault)
    assert label, "the fault service finds its target by label"
    targets = [n for n, s in services().items() if (s.get("labels") or {}).get(label.group(1)) == "true"]
    assert targets == ["kafka3"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in services()["fault"]["volumes"]


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.M)
    assert base
    image = base.group(1)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-\w+", image), f"base image {image} not pinned to a 3.11 slim release"
    assert "openjdk-17-jre-headless" in text
    assert re.search(r"pip install \.", text)
    assert re.search(r'^ENTRYPOINT \["isrwatch"\]', text, re.M)
    copied = [m.group(1) for m in re.finditer(r"^COPY\s+(.+?)\s+\S+$", text, re.M)]
    sources = {s for line in copied for s in line.split()}
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: missing"
    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    assert packages <= sources, f"packages not copied into the image: {packages - sources}"
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert not sources & set(ignored)


def test_the_image_has_what_package_data_links_to() -> None:
    """exporter/runbook.md links to docs/runbook.md: ``pip install .`` in the image needs both."""
    text = DOCKERFILE.read_text()
    copied = {s for m in re.finditer(r"^COPY\s+(.+?)\s+\S+$", text, re.M) for s in m.group(1).split()}
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    links = [
        p for package, patterns in data.items() for g in patterns for p in (REPO / package).glob(g) if p.is_symlink()
    ]
    assert links, "no package data is a link: this test has nothing left to check"
    for link in links:
        target = link.resolve().relative_to(REPO).as_posix()
        assert target in copied, f"{link.relative_to(REPO)} links to {target}, which the image does not COPY"


@pytest.mark.parametrize("name", ["collector", "job", "exporter"])
def test_core_isrwatch_services_restart(name: str) -> None:
    assert services()[name].get("restart") == "unless-stopped"


def test_the_spark_profile_runs_a_standalone_cluster_the_job_can_use() -> None:
    """Issue 12: a master and a worker (Spark's own standalone classes, as localspark starts
    them), the job pointed at the master through its environment, the checkpoint shared."""
    from localspark.cluster import MASTER_CLASS, WORKER_CLASS

    spark = spark_services()
    assert {"spark-master", "spark-worker"} <= set(spark)
    for name in spark:
        assert services()[name].get("profiles") == ["spark"], f"{name}: only with --profile spark"
    master, worker = spark["spark-master"], spark["spark-worker"]
    assert master[0] == MASTER_CLASS and worker[0] == WORKER_CLASS
    url = f"spark://spark-master:{_flag(master, '--port')}"
    assert worker[-1] == url
    work_dir = _flag(worker, "--work-dir")
    assert work_dir and work_dir.startswith("/var/lib/isrwatch/"), "the image's user can write there"
    job = services()["job"]
    assert job["environment"]["ISRWATCH_SPARK_MASTER"] == "${ISRWATCH_SPARK_MASTER:-local[2]}"
    assert url in COMPOSE_FILE.read_text().split("ISRWATCH_SPARK_MASTER=", 1)[1].split()[0]
    checkpoint = _flag(isrwatch_services()["job"], "--checkpoint-dir")
    assert any(v.endswith(f":{checkpoint}") for v in job["volumes"])
    shared = [v for v in services()["spark-worker"]["volumes"] if v.endswith(f":{checkpoint}")]
    assert shared and shared[0].split(":")[0] in {v.split(":")[0] for v in job["volumes"]}, "same volume, same path"
    assert job.get("hostname") == "job", "the driver's address the workers call back"


def test_the_job_is_given_the_time_its_stop_waits_for_a_running_batch() -> None:
    """``docker stop`` kills after the service's grace period (10 s by default): the job's stop
    lets the batch under way finish for longer than that (streaming.lifecycle.stopping)."""
    from streaming.lifecycle.stopping import stop_allowance_s

    job = services()["job"]
    trigger = _flag(isrwatch_services()["job"], "--trigger-seconds")
    grace = str(job.get("stop_grace_period", "10s"))
    assert grace.endswith("s") and grace[:-1].isdigit(), f"a grace period in seconds: {grace}"
    assert int(grace[:-1]) > stop_allowance_s(float(trigger or 1.0)), grace
