"""`tidewire serve` refuses to start, with one clear line, when a security file it was given cannot be used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidewire", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "data"), *args], capture_output=True, text=True, timeout=30)


def test_bad_password_file_stops_the_start_without_quoting_it(tmp_path: Path) -> None:
    bad = tmp_path / "passwd"
    bad.write_text("alice plain-text-secret\n")
    done = serve(tmp_path, "--password-file", str(bad))
    assert done.returncode == 2
    assert "cannot start" in done.stderr and f"{bad}:1" in done.stderr
    assert "plain-text-secret" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_tls_listener_without_certificate_stops_the_start(tmp_path: Path) -> None:
    done = serve(tmp_path, "--tls-port", "0")
    assert done.returncode == 2 and "certfile and keyfile" in done.stderr
