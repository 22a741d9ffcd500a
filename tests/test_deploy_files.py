"""The deployment files under docs/deploy/ parse, run a worker the real parser accepts, and stop it gracefully.

Every worker command line in them (systemd's `ExecStart`, compose's `command`, a Kubernetes
container's `command` and `args`) goes through the parser of `manage.py threadmill` itself; every
stop timeout outlasts that command's `--shutdown-timeout` plus the supervisor's grace before it
kills a worker process (`SHUTDOWN_GRACE_S`), since only then does SIGKILL come; the stop signal is
SIGTERM; REDIS_URL is never written into a file; the console's probes reach the readiness view.
The how-to pages show these files by `{literalinclude}`, so the text shown is the text tested.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from daphne.cli import CommandLineInterface
from django.urls import resolve

from inspector.ready import ready
from threadmill.management.commands.threadmill import Command
from threadmill.worker.supervisor import SHUTDOWN_GRACE_S

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "docs" / "deploy"
HOW_TO = ROOT / "docs" / "how-to"
UNIT = DEPLOY / "systemd" / "threadmill-worker.service"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
MANIFESTS = [DEPLOY / "kubernetes" / "worker.yaml", DEPLOY / "kubernetes" / "console.yaml"]
#: Which page shows which files.
PAGES = {
    "systemd.md": [UNIT],
    "docker.md": [DOCKERFILE, COMPOSE],
    "kubernetes.md": MANIFESTS,
}
#: The stop signals that start the worker's graceful shutdown, as each tool may spell SIGTERM.
SIGTERM = {"SIGTERM", "TERM", "15"}
#: The instructions a Dockerfile may hold.
DOCKERFILE_INSTRUCTIONS = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip
#: A systemd time span's units, in seconds.
SYSTEMD_UNITS = {"": 1, "s": 1, "sec": 1, "ms": 0.001, "m": 60, "min": 60, "h": 3600, "hr": 3600}
#: A compose duration's units, in seconds.
COMPOSE_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


# -- reading the files ------------------------------------------------------------------


def unit_file(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Parse a systemd unit: each section's (key, value) pairs in order (a key may repeat, as Environment= does)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for number, line in enumerate(path.read_text().replace("\\\n", " ").splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if match := re.fullmatch(r"\[([A-Za-z]+)\]", line):
            current = sections.setdefault(match[1], [])
        elif current is not None and (match := re.fullmatch(r"([A-Za-z][A-Za-z0-9]*)=(.*)", line)):
            current.append((match[1], match[2].strip()))
        else:
            raise ValueError(f"{path.name}:{number} is neither a section header nor Key=value: {line!r}")
    return sections


def service(path: Path) -> dict[str, list[str]]:
    """Return the [Service] section of a unit, each key's values in order."""
    found: dict[str, list[str]] = {}
    for key, value in unit_file(path).get("Service", []):
        found.setdefault(key, []).append(value)
    return found


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """Parse a Dockerfile into (instruction, arguments), continuation lines joined; raise on an unknown one."""
    found = []
    for line in path.read_text().replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() not in DOCKERFILE_INSTRUCTIONS:
            raise ValueError(f"{path.name}: {instruction!r} is no Dockerfile instruction")
        found.append((instruction.upper(), arguments.strip()))
    return found


def yaml_documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def systemd_seconds(text: str) -> float:
    """Parse a systemd time span ("40", "40s", "1min 10s") into seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", text):
        raise ValueError(f"{text!r} is not a systemd time span")
    return sum(float(number) * SYSTEMD_UNITS[unit] for number, unit in parts)


def compose_seconds(text: str) -> float:
    """Parse a compose duration ("40s", "1m30s") into seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a compose duration")
    return sum(float(number) * COMPOSE_UNITS[unit] for number, unit in parts)


def pod_specs(path: Path) -> list[dict[str, Any]]:
    """Return the pod template spec of every workload in a manifest file."""
    return [
        doc["spec"]["template"]["spec"] for doc in yaml_documents(path) if doc["kind"] in {"Deployment", "StatefulSet"}
    ]


def container_argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def compose_services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def compose_argv(definition: dict[str, Any]) -> list[str]:
    command = definition.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


# -- worker command lines ---------------------------------------------------------------


def worker_arguments(argv: list[str]) -> list[str] | None:
    """Return what follows `manage.py threadmill` in a worker command line (from "worker" on); None for another command."""
    for index, word in enumerate(argv[:-1]):
        if word == "threadmill" and argv[index + 1] == "worker":
            assert index and argv[index - 1].endswith("manage.py"), f"the worker runs through manage.py: {argv}"
            return argv[index + 1 :]
    return None


def shutdown_timeout(arguments: list[str]) -> float:
    """Parse a worker command line with the real `manage.py threadmill` parser; return its --shutdown-timeout."""
    parser = Command().create_parser("manage.py", "threadmill")
    return parser.parse_args(arguments).shutdown_timeout


def must_outlast(arguments: list[str]) -> float:
    """Return the stop timeout a worker with these arguments needs to stop on its own: before the SIGKILL."""
    return shutdown_timeout(arguments) + SHUTDOWN_GRACE_S


def unit_workers() -> list[list[str]]:
    found = []
    for line in service(UNIT).get("ExecStart", []):
        arguments = worker_arguments(shlex.split(line.lstrip("@-:+!")))
        if arguments is not None:
            found.append(arguments)
    return found


def compose_workers() -> list[tuple[dict[str, Any], list[str]]]:
    found = []
    for definition in compose_services().values():
        arguments = worker_arguments(compose_argv(definition))
        if arguments is not None:
            found.append((definition, arguments))
    return found


def manifest_workers(path: Path) -> list[tuple[dict[str, Any], list[str]]]:
    """Return (pod spec, worker arguments) for every worker container of a manifest file."""
    found = []
    for spec in pod_specs(path):
        for container in spec["containers"]:
            arguments = worker_arguments(container_argv(container))
            if arguments is not None:
                found.append((spec, arguments))
    return found


# -- the tests --------------------------------------------------------------------------


def test_every_deployment_file_parses():
    assert unit_file(UNIT)["Service"]
    assert dockerfile_instructions(DOCKERFILE)[0][0] == "FROM"
    assert compose_services()
    for path in MANIFESTS:
        assert all(document["apiVersion"] and document["kind"] for document in yaml_documents(path))


def test_every_file_under_docs_deploy_is_one_these_tests_read():
    known = {UNIT, DOCKERFILE, COMPOSE, *MANIFESTS}
    assert sorted(str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*") if p.is_file() and p not in known) == []


def test_each_file_that_runs_workers_has_a_worker_command_line_the_real_parser_accepts():
    command_lines = {
        "systemd": unit_workers(),
        "compose": [arguments for _, arguments in compose_workers()],
        "kubernetes": [arguments for _, arguments in manifest_workers(MANIFESTS[0])],
    }
    assert [name for name, found in command_lines.items() if not found] == []
    for found in command_lines.values():
        for arguments in found:
            assert shutdown_timeout(arguments) > 0


def test_the_systemd_stop_timeout_outlasts_the_worker_s_shutdown():
    timeouts = service(UNIT).get("TimeoutStopSec", [])
    assert len(timeouts) == 1, "name TimeoutStopSec= once: systemd's default is the host's, not the worker's"
    for arguments in unit_workers():
        assert systemd_seconds(timeouts[0]) > must_outlast(arguments), arguments


def test_the_compose_stop_grace_period_outlasts_the_worker_s_shutdown():
    for definition, arguments in compose_workers():
        assert "stop_grace_period" in definition, "Docker's default is 10 s"
        assert compose_seconds(definition["stop_grace_period"]) > must_outlast(arguments), arguments


def test_the_kubernetes_grace_period_outlasts_the_worker_s_shutdown():
    for path in MANIFESTS:
        for spec, arguments in manifest_workers(path):
            assert "terminationGracePeriodSeconds" in spec, f"{path.name}: Kubernetes' default is 30 s"
            assert spec["terminationGracePeriodSeconds"] > must_outlast(arguments), (path.name, arguments)


def test_the_stop_signal_is_sigterm_or_the_default():
    signals = service(UNIT).get("KillSignal", [])
    signals += [definition["stop_signal"] for definition in compose_services().values() if "stop_signal" in definition]
    signals += [
        arguments for instruction, arguments in dockerfile_instructions(DOCKERFILE) if instruction == "STOPSIGNAL"
    ]
    for path in MANIFESTS:
        for spec in pod_specs(path):
            signals += [
                c["lifecycle"]["stopSignal"] for c in spec["containers"] if "stopSignal" in c.get("lifecycle", {})
            ]
    assert [signal for signal in signals if signal.upper() not in SIGTERM] == []


def test_systemd_signals_the_supervisor_alone():
    # The default, control-group, sends SIGTERM to every worker process besides the supervisor, which
    # passes its own on: a worker process's second SIGTERM stops it at once, its running tasks unfinished.
    assert service(UNIT).get("KillMode") == ["mixed"]


def test_a_container_s_worker_names_its_process_count_and_runs_in_exec_form():
    # The default of --workers counts the node's CPUs, not the container's share of them.
    found = [*compose_workers(), *(pair for path in MANIFESTS for pair in manifest_workers(path))]
    named = re.compile(r"-w\d*$|--workers(=.*)?$")
    assert [arguments for _, arguments in found if not any(named.match(word) for word in arguments)] == []
    assert [name for name, d in compose_services().items() if isinstance(d.get("command", []), str)] == []


def test_the_image_s_user_is_a_number_so_run_as_non_root_can_check_it():
    # The kubelet refuses to start a runAsNonRoot container whose image names its user by name.
    users = [arguments for instruction, arguments in dockerfile_instructions(DOCKERFILE) if instruction == "USER"]
    assert users and users[-1].partition(":")[0].isdigit() and int(users[-1].partition(":")[0]) != 0
    assert all(spec["securityContext"]["runAsNonRoot"] for path in MANIFESTS for spec in pod_specs(path))


def compose_redis_urls() -> list[str]:
    services = compose_services().values()
    urls = [str(d["environment"]["REDIS_URL"]) for d in services if "REDIS_URL" in d.get("environment", {})]
    assert urls, "the compose services get REDIS_URL"
    return urls


def test_redis_url_comes_from_a_secret_or_the_environment_never_the_file():
    assert all(value.startswith("${") for value in compose_redis_urls()), compose_redis_urls()
    for path in MANIFESTS:
        for spec in pod_specs(path):
            for container in spec["containers"]:
                env = {item["name"]: item for item in container.get("env", [])}
                assert "secretKeyRef" in env["REDIS_URL"].get("valueFrom", {}), (path.name, container["name"])


def daphne_accepts(argv: list[str]) -> bool:
    return argv[:1] == ["daphne"] and bool(CommandLineInterface().parser.parse_args(argv[1:]).application)


def ready_path(url: str) -> bool:
    return resolve(url).func is ready


def test_the_kubernetes_console_runs_behind_daphne_ready_when_the_ready_view_says_so():
    consoles = [c for spec in pod_specs(MANIFESTS[1]) for c in spec["containers"] if c["name"] == "console"]
    assert len(consoles) == 1 and daphne_accepts(container_argv(consoles[0]))
    assert ready_path(consoles[0]["readinessProbe"]["httpGet"]["path"])
    # Liveness never asks the server: restarting the console cannot mend Redis.
    assert "httpGet" not in consoles[0].get("livenessProbe", {})


def test_the_compose_console_runs_behind_daphne_healthy_when_the_ready_view_says_so():
    console = compose_services()["console"]
    assert daphne_accepts(compose_argv(console))
    paths = re.findall(r"http://[^/'\"]+(/[^'\"]*)", " ".join(console["healthcheck"]["test"]))
    assert len(paths) == 1 and ready_path(paths[0])


def literal_includes(page: Path) -> set[Path]:
    """Return the files a MyST page shows with `{literalinclude}`, resolved from the page."""
    targets = re.findall(r"^```\{literalinclude\}\s+(\S+)", page.read_text(), flags=re.MULTILINE)
    return {(page.parent / target).resolve() for target in targets}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_each_how_to_page_shows_its_files(page):
    included = literal_includes(HOW_TO / page)
    assert [p.name for p in PAGES[page] if p.resolve() not in included] == []


def test_the_deploying_page_links_the_three_guides():
    text = (HOW_TO / "deploying.md").read_text()
    assert [page for page in PAGES if f"]({page}" not in text] == []
