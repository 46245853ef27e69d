"""deploy/Dockerfile, .dockerignore and deploy/compose.yaml: the image runs a real `tidewire` command as a
non-root user with the contract's ports and health check; the compose file is valid against the compose-spec
schema, its services wait for each other's health, and every setting and command in it is one Tidewire knows."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.deploy import (
    ADMIN_PORT,
    COMPOSE,
    COMPOSE_SCHEMA,
    DEPLOY,
    DOCKERFILE,
    GATEWAY_SERVICES,
    ROOT,
    load_yaml_docs,
    serve_argv_problems,
)
from tidewire.gateway.config import Settings

CONTRACT_PORTS = {1883, 8883, 8083, 18083, 5672, 8081}
NON_GATEWAY_ENV = {"TIDEWIRE_LAKE_STORE", "TIDEWIRE_LAKE_DIR"}  # read by `tidewire lake run` / `pipeline run`


# -- a small Dockerfile reader ----------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def get(self, instruction: str) -> list[str]:
        return [args for ins, args in self.instructions if ins == instruction]


def dockerfile_stages(text: str) -> list[Stage]:
    """Stages in order, each with its instructions (continuations joined, comments dropped, ARGs substituted in
    FROM lines)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue  # a comment line, also inside a continued instruction, as BuildKit does
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        elif instruction == "FROM":
            words = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name=name, base=words[0]))
        else:
            stages[-1].instructions.append((instruction, rest.strip()))
    return stages


def stage_chain(stages: list[Stage], target: str | None = None) -> list[Stage]:
    """The stages an image of `target` (default: the last stage) is built on, base first."""
    by_name = {s.name: s for s in stages}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        chain.insert(0, stage)
    return chain


def effective(chain: list[Stage]) -> dict[str, Any]:
    """ENTRYPOINT, CMD, USER, HEALTHCHECK, EXPOSE, VOLUME and ENV of the image, as Docker inherits them."""
    out: dict[str, Any] = {"entrypoint": None, "cmd": None, "user": "root", "healthcheck": None,
                           "expose": set(), "volume": [], "env": {}, "run": []}
    for stage in chain:
        sets_entrypoint = bool(stage.get("ENTRYPOINT"))
        if sets_entrypoint and not stage.get("CMD"):
            out["cmd"] = None  # Docker: a new ENTRYPOINT resets an inherited CMD
        for instruction, args in stage.instructions:
            if instruction == "ENTRYPOINT":
                out["entrypoint"] = json.loads(args)
            elif instruction == "CMD":
                out["cmd"] = json.loads(args)
            elif instruction == "USER":
                out["user"] = args
            elif instruction == "HEALTHCHECK":
                out["healthcheck"] = None if args == "NONE" else args
            elif instruction == "EXPOSE":
                out["expose"] |= {int(p.split("/")[0]) for p in args.split()}
            elif instruction == "VOLUME":
                out["volume"] += json.loads(args) if args.startswith("[") else args.split()
            elif instruction == "ENV":
                for word in shlex.split(args):
                    key, _, value = word.partition("=")
                    out["env"][key] = value
            elif instruction == "RUN":
                out["run"].append(args)
    return out


def image(target: str | None = None) -> dict[str, Any]:
    return effective(stage_chain(dockerfile_stages(DOCKERFILE.read_text()), target))


def healthcheck_command(healthcheck: str) -> str:
    """The shell command of `HEALTHCHECK [--options] CMD <command>`."""
    return healthcheck.split(" CMD ", 1)[1] if " CMD " in f" {healthcheck}" else healthcheck


# -- Dockerfile -------------------------------------------------------------------------------------------------

def test_dockerfile_reader() -> None:
    stages = dockerfile_stages("ARG B=python:3.11-slim\nFROM ${B} AS a\n# c\nRUN x \\\n  # inner\n  && y\n"
                               "ENTRYPOINT [\"e\"]\nCMD [\"c\"]\nFROM a AS b\nENTRYPOINT [\"f\"]\n")
    assert [(s.name, s.base) for s in stages] == [("a", "python:3.11-slim"), ("b", "a")]
    assert stages[0].get("RUN") == ["x  && y"]
    img = effective(stage_chain(stages))
    assert img["entrypoint"] == ["f"] and img["cmd"] is None


def test_gateway_image_runs_tidewire_serve() -> None:
    img = image()
    entrypoint = img["entrypoint"]
    assert entrypoint[-1] == "tidewire", entrypoint
    assert entrypoint[:-1] in ([], ["tini", "--"])
    assert img["cmd"][0] == "serve"
    assert not serve_argv_problems(img["cmd"]), serve_argv_problems(img["cmd"])
    assert img["cmd"][img["cmd"].index("--host") + 1] == "0.0.0.0"
    assert "tini" not in entrypoint or any("install" in r and "tini" in r for r in img["run"])


def test_gateway_image_user_ports_volume_and_health() -> None:
    img = image()
    assert img["user"].split(":")[0] not in ("root", "0")
    assert any("useradd" in r and "--uid 10001" in r for r in img["run"])
    assert img["expose"] >= CONTRACT_PORTS
    assert img["env"]["TIDEWIRE_DATA_DIR"] == "/var/lib/tidewire"
    assert img["volume"] == ["/var/lib/tidewire"]
    for name in img["env"]:
        if name.startswith("TIDEWIRE_"):
            assert name.removeprefix("TIDEWIRE_").lower() in Settings.model_fields, name
    check = healthcheck_command(img["healthcheck"])
    assert "/healthz" in check and str(ADMIN_PORT) in check and "urllib" in check
    assert "curl" not in check and "wget" not in check  # neither is in the slim image


def test_stages_base_java_and_install() -> None:
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert all(s.base.startswith("python:3.11-slim") for s in stages if s.base not in {t.name for t in stages})
    default = image()
    assert not any("openjdk" in r or "jre" in r for r in default["run"]), "no Java in the gateway image"
    pipeline = image("pipeline")
    assert any("openjdk-17-jre-headless" in r for r in pipeline["run"])
    assert pipeline["healthcheck"] is None  # a Spark job has no admin port
    assert pipeline["user"].split(":")[0] not in ("root", "0")
    # its default command is a real one
    run = subprocess.run([sys.executable, "-m", "tidewire", *pipeline["cmd"]], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert run.returncode == 0 and "aggregates" in run.stdout, run.stderr
    installs = [r for s in stages for r in s.get("RUN") if "pip install" in r]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    asked = [set(m.split(",")) for r in installs for m in re.findall(r"""["']\.\[([\w,-]+)\]["']""", r)]
    # the gateway image: every extra a node serves with (the admin port answers the HEALTHCHECK), no PySpark;
    # the pipeline image adds it
    assert asked == [set(extras) - {"all", "dev", "pipeline"}, {"pipeline"}], asked
    assert set(extras["all"][0].split("[")[1].rstrip("]").split(",")) == set(extras) - {"all", "dev"}


def test_dockerignore_keeps_sources_and_drops_local_state() -> None:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)

    def ignored(path: str) -> bool:
        for pattern in patterns:
            if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
                return True
            if pattern.startswith("**/") and any(fnmatch.fnmatch(part, pattern[3:]) for part in path.split("/")):
                return True
        return False

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    for needed in ["pyproject.toml", "README.md", *packages, "gateway/cli/__init__.py"]:
        assert not ignored(needed), needed
    for private in [".git", ".venv", "data", "tests", "deploy/tidewire.env", "gateway/__pycache__",
                    "data/api_token", ".helpers"]:
        assert ignored(private), private


# -- compose.yaml -----------------------------------------------------------------------------------------------

def compose() -> dict[str, Any]:
    (doc,) = load_yaml_docs(COMPOSE)
    data: dict[str, Any] = doc
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def env_file_vars(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def health_enabled(service: dict[str, Any]) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable", False)
    if str(service.get("image", "")).startswith("tidewire"):  # the image's own HEALTHCHECK
        return image(service.get("build", {}).get("target")).get("healthcheck") is not None
    return False


def test_compose_validates_against_the_compose_spec() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    broken = compose()
    broken["services"]["redis"]["healthcheck"]["intervall"] = "5s"
    assert not jsonschema.Draft7Validator(schema).is_valid(broken)  # the schema does catch a typo


def test_compose_services_and_profiles() -> None:
    svc = services()
    assert set(svc) == {"redis", *GATEWAY_SERVICES, "prometheus", "grafana", "lake", "spark"}
    assert svc["grafana"]["profiles"] == ["grafana"]
    assert svc["lake"]["profiles"] == svc["spark"]["profiles"] == ["spark"]
    for name in ("redis", *GATEWAY_SERVICES, "prometheus"):
        assert "profiles" not in svc[name], name


def test_compose_health_and_start_order() -> None:
    svc = services()
    for name, service in svc.items():
        if name not in ("lake", "spark"):
            assert health_enabled(service), f"{name} has no health check"
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in svc, (name, dependency)
            assert condition["condition"] in ("service_healthy", "service_started"), (name, dependency)
            if condition["condition"] == "service_healthy":
                assert health_enabled(svc[dependency]), f"{name} waits for {dependency}'s health, which is off"
    for name in GATEWAY_SERVICES:
        assert svc[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        check = " ".join(svc[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{ADMIN_PORT}/readyz" in check
    assert {d: c["condition"] for d, c in svc["prometheus"]["depends_on"].items()} == \
        dict.fromkeys(GATEWAY_SERVICES, "service_healthy")
    assert svc["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_compose_redis_keeps_an_aof() -> None:
    redis = services()["redis"]
    command = redis["command"]
    assert command[0] == "redis-server" and redis["image"].startswith("redis:7")
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "always"
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_compose_gateways_form_one_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    svc = services()
    secrets_env = env_file_vars(DEPLOY / "tidewire.env.example")
    assert set(secrets_env) == {"TIDEWIRE_CLUSTER_SECRET", "TIDEWIRE_API_TOKEN"}
    published = []
    for name in GATEWAY_SERVICES:
        service = svc[name]
        assert service["env_file"] == "tidewire.env"
        assert "command" not in service  # the image's CMD: serve --host 0.0.0.0
        env = env_of(service)
        assert env["TIDEWIRE_NODE_ID"] == env["TIDEWIRE_CLUSTER_HOST"] == name
        assert env["TIDEWIRE_STORE"] == "redis://redis:6379/0"
        for key in os.environ:
            if key.startswith("TIDEWIRE_"):
                monkeypatch.delenv(key)
        for key, value in {**secrets_env, **env}.items():
            assert key.removeprefix("TIDEWIRE_").lower() in Settings.model_fields, key
            monkeypatch.setenv(key, value)
        settings = Settings.load()
        assert settings.node_id == name and settings.cluster_port == 11883
        assert settings.admin_port == ADMIN_PORT
        assert _seconds(service["stop_grace_period"]) > settings.drain_timeout
        ports = [str(p) for p in service["ports"]]
        assert f"127.0.0.1:{18083 + GATEWAY_SERVICES.index(name)}:{ADMIN_PORT}" in ports
        published += [p.rsplit(":", 1)[0] for p in ports]
    assert len(published) == len(set(published)), "two services publish one host port"
    assert {p for p in published if p.isdigit()} >= {"1883", "1884", "1885"}


def _seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def test_compose_spark_profile_commands_are_real() -> None:
    """The lake and Spark commands parse with the real parsers `tidewire lake run` / `pipeline run` forward to."""
    from tidewire.pipeline.cli import build_parser
    from tidewire.pipeline.lake.command import _parser as lake_parser

    svc = services()
    lake = svc["lake"]["command"]
    assert lake[:2] == ["lake", "run"]
    args = lake_parser().parse_args(lake[2:])
    assert str(args.lake) == "/lake"
    assert set(env_of(svc["lake"])) <= NON_GATEWAY_ENV
    assert env_of(svc["lake"])["TIDEWIRE_LAKE_STORE"] == "redis://redis:6379/0"
    spark = svc["spark"]["command"]
    assert spark[:2] == ["pipeline", "run"]
    parsed = build_parser().parse_args(["run", *spark[2:]])
    assert parsed.job == "aggregates" and parsed.lake == "/lake" and parsed.every == 30.0
    assert svc["spark"]["build"]["target"] == "pipeline"
    assert any(v == "lake:/lake" for v in svc["spark"]["volumes"]) and "lake" in compose()["volumes"]
    # the image creates /lake for its non-root user, so the named volume mounted there is writable
    assert any("/lake" in r for r in image()["run"])


def test_compose_builds_and_mounts_resolve() -> None:
    svc = services()
    stage_names = {s.name for s in dockerfile_stages(DOCKERFILE.read_text())}
    for name, service in svc.items():
        build = service.get("build")
        if build:
            context = (DEPLOY / build["context"]).resolve()
            assert context == ROOT and (context / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
            assert build["target"] in stage_names, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
            else:
                assert source in compose()["volumes"], (name, source)
    prometheus = svc["prometheus"]
    config = next(a for a in prometheus["command"] if a.startswith("--config.file=")).split("=", 1)[1]
    mount = next(v for v in prometheus["volumes"] if v.startswith("./prometheus:"))
    assert Path(config).parent == Path(mount.split(":")[1])


# -- building the image (needs a docker daemon: skipped on most machines) ----------------------------------

def _docker_works() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not _docker_works(), reason="no docker daemon")
def test_image_builds_and_serves_help() -> None:
    tag = "tidewire-test:deploy"
    build = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)], capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    try:
        run = subprocess.run(["docker", "run", "--rm", tag, "serve", "--help"], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0 and "--admin-port" in run.stdout, run.stderr
        user = subprocess.run(["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True,
                              text=True, timeout=60)
        assert user.stdout.strip() == "10001"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
