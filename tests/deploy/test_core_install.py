"""`pip install tidewire` (the core, no extra; the wheel with its hot path compiled, as a machine with a C compiler
builds it) into a clean venv, as a new user does: it runs the compiled modules, serves MQTT on the embedded store
with QoS 1 persistence across kill -9; the listeners that are on by default but need an extra stay off with one
log line each; a part asked for without its extra refuses to start and names the extra.

make test-slow: pip resolves the core's dependencies from the package index (its cache when warm).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.ports import free_port
from tests.integration.conftest import PahoFactory, wait_accepting

pytestmark = pytest.mark.slow

# distributions only an extra may bring (pyproject.toml's optional dependencies)
EXTRA_ONLY = {"redis", "hiredis", "msgspec", "pamqp", "grpcio", "protobuf", "fastapi",
              "uvicorn", "prometheus-client", "httpx", "pyjwt", "pyarrow", "pyspark", "paho-mqtt"}


@pytest.fixture(scope="module")
def core(compiled_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin/ with the core installed."""
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(compiled_wheel)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def _installed(bin_dir: Path) -> dict[str, int]:
    """Distribution name -> its installed bytes (RECORD sizes), pip and setuptools aside."""
    code = ("import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower(): "
            "sum(f.size or 0 for f in d.files or []) for d in m.distributions()}))")
    out = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return {k: v for k, v in json.loads(out).items() if k not in ("pip", "setuptools")}


def test_the_installed_hot_path_is_compiled(core: Path, compiled_wheel: Path, tmp_path: Path) -> None:
    assert "-py3-none-any" not in compiled_wheel.name  # a platform wheel: it holds C extensions
    probe = ("import importlib, json; from tidewire.compiled import MODULES, is_compiled; "
             "print(json.dumps({m: is_compiled(importlib.import_module(m)) for m in MODULES}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TIDEWIRE_PURE_PYTHON")}
    out = subprocess.run([str(core / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    kinds = json.loads(out.stdout)
    assert kinds and all(kinds.values()), kinds
    env["TIDEWIRE_PURE_PYTHON"] = "1"
    out = subprocess.run([str(core / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=env)
    assert not any(json.loads(out.stdout).values())


def test_core_installs_no_extra(core: Path) -> None:
    installed = _installed(core)
    assert "tidewire" in installed
    assert not EXTRA_ONLY & set(installed), EXTRA_ONLY & set(installed)
    total_mb = sum(installed.values()) / 2**20
    print(f"core install: {len(installed)} distributions, {total_mb:.1f} MB")  # the number for the notes
    assert total_mb < 150


@pytest.fixture
def serve(core: Path, tmp_path: Path) -> Iterator[tuple[int, Path, list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield free_port(), tmp_path, procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start(core: Path, port: int, data: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    with log.open("ab") as out:
        proc = subprocess.Popen([str(core / "tidewire"), "serve", "--port", str(port), "--data-dir", str(data)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=data.parent)
    wait_accepting(port)
    return proc


def test_core_serves_mqtt_with_qos1_persistence(core: Path, serve: tuple[int, Path, list[subprocess.Popen[bytes]]],
                                                paho_factory: PahoFactory) -> None:
    port, tmp, procs = serve
    data, log = tmp / "data", tmp / "node.log"
    procs.append(_start(core, port, data, log))
    text = log.read_text()
    for listener, extra in (("AMQP", "amqp"), ("RocketMQ", "rocketmq"), ('"admin HTTP"', "admin")):
        lines = [x for x in text.splitlines() if "listener.off" in x and f"listener={listener}" in x]
        assert len(lines) == 1 and f"tidewire[{extra}] is not installed" in lines[0], text

    sub = paho_factory(port, "keeper", clean=False)
    sub.connect(clean_start=False, session_expiry=3600)
    sub.subscribe("plant/#", qos=1)
    sub.disconnect()
    pub = paho_factory(port, "sensor")
    pub.connect()
    for i in range(20):
        pub.publish(f"plant/line/{i}", f"reading {i}".encode(), qos=1)  # returns once PUBACKed: durable
    pub.disconnect()
    os.kill(procs[0].pid, signal.SIGKILL)
    procs[0].wait()

    procs.append(_start(core, port, data, log))
    again = paho_factory(port, "keeper", clean=False)
    again.connect(clean_start=False, session_expiry=3600)
    got = again.expect(20, timeout=10)
    assert sorted(r.payload for r in got) == sorted(f"reading {i}".encode() for i in range(20))


@pytest.mark.parametrize(("args", "env", "says"), [
    (["serve", "--amqp-port", "{port}"], {}, "the AMQP listener (amqp_port) needs tidewire[amqp]"),
    (["serve"], {"TIDEWIRE_ROCKETMQ_PORT": "{port}"}, "the RocketMQ listener (rocketmq_port) needs tidewire[rocketmq]"),
    (["serve", "--admin-port", "{port}"], {}, "the admin HTTP listener (admin_port) needs tidewire[admin]"),
    (["serve", "--store", "redis://127.0.0.1:{port}/0"], {}, "the store redis:// needs tidewire[redis]"),
    (["serve"], {"TIDEWIRE_JWT_SECRET": "s"}, "JWT authentication"),
    (["serve", "--lake", "lake"], {}, "the lake (lake_dir) needs tidewire[lake]"),
    (["cluster", "status"], {}, "tidewire cluster needs tidewire[redis]"),
    (["ctl", "status"], {}, "tidewire ctl needs tidewire[admin]"),
    (["lake", "run"], {}, "tidewire lake needs tidewire[lake]"),
    (["pipeline", "run", "reports"], {}, "tidewire pipeline run needs tidewire[pipeline]"),
])
def test_a_part_asked_for_without_its_extra_names_it(core: Path, tmp_path: Path, args: list[str],
                                                     env: dict[str, str], says: str) -> None:
    port = str(free_port())
    argv = [a.format(port=port) for a in args]
    if argv[0] == "serve":
        argv += ["--port", str(free_port()), "--data-dir", str(tmp_path / "data")]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIDEWIRE_")}
    done = subprocess.run([str(core / "tidewire"), *argv], capture_output=True, text=True, cwd=tmp_path,
                          env={**clean, **{k: v.format(port=port) for k, v in env.items()}}, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr and "pip install 'tidewire[" in done.stderr and "Traceback" not in done.stderr
