"""``kvwise controller`` as a process: it refuses an open API on the network unless told,
refuses blank tokens, and says at start who may call the API (loudly when anyone on the
network may)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from controlplane.dev.embedded_redis import free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _env(redis_url: str, key_prefix: str, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVWISE_")}
    return {**base, "KVWISE_REDIS_URL": redis_url, "KVWISE_KEY_PREFIX": key_prefix, **extra}


def _kvwise() -> str:
    exe = shutil.which("kvwise")
    assert exe is not None, "the kvwise console script is not installed (pip install -e .)"
    return exe


def _refused(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [_kvwise(), "controller", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return " ".join(done.stderr.split())


def _start_log(env: dict[str, str], host: str) -> str:
    """Start the controller on ``host``, wait until it serves, stop it: its log."""
    port = free_port()
    proc = subprocess.Popen(
        [_kvwise(), "controller", "--host", host, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                assert proc.poll() is None, proc.communicate()[0][-2000:]
                assert time.monotonic() < deadline, "the controller never served"
                time.sleep(0.2)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    return out


def test_an_open_api_on_the_network_is_refused(redis_url: str, key_prefix: str) -> None:
    said = _refused(_env(redis_url, key_prefix), "--host", "0.0.0.0")
    assert "refusing to serve an open API on 0.0.0.0" in said
    assert "KVWISE_API_TOKEN" in said and "KVWISE_ALLOW_OPEN_API=1" in said


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_token_is_refused(redis_url: str, key_prefix: str, blank: str) -> None:
    said = _refused(_env(redis_url, key_prefix, KVWISE_API_TOKEN=blank))
    assert "bad controller setting KVWISE_API_TOKEN: a token must not be empty or blank" in said


def test_an_allowed_open_api_on_the_network_is_announced_loudly(
    redis_url: str, key_prefix: str
) -> None:
    log = _start_log(_env(redis_url, key_prefix, KVWISE_ALLOW_OPEN_API="1"), "0.0.0.0")
    loud = [line for line in log.splitlines() if "IS OPEN TO THE NETWORK" in line]
    assert len(loud) == 1, log[-2000:]
    assert " ERROR " in loud[0]


def test_an_open_api_on_loopback_is_a_warning(redis_url: str, key_prefix: str) -> None:
    log = _start_log(_env(redis_url, key_prefix), "127.0.0.1")
    warned = [line for line in log.splitlines() if "is open: no KVWISE_API_TOKEN" in line]
    assert len(warned) == 1 and " WARNING " in warned[0], log[-2000:]


def test_a_token_on_the_network_starts_quietly(redis_url: str, key_prefix: str) -> None:
    log = _start_log(_env(redis_url, key_prefix, KVWISE_API_TOKEN="t0ken"), "0.0.0.0")
    assert "mutations need the API token; reads are open" in log
    assert "OPEN TO THE NETWORK" not in log and "is open" not in log


@pytest.mark.parametrize(
    ("host", "written"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]")], ids=["ipv4", "ipv6"]
)
def test_the_start_line_writes_an_ipv6_address_in_brackets(
    caplog: pytest.LogCaptureFixture, host: str, written: str
) -> None:
    """``--host ::1`` logged "the API on ::1:18085": the port read as part of the address."""
    from controlplane.api.exposure import announce_exposure
    from controlplane.service.settings import ControllerSettings

    with caplog.at_level("INFO", logger="controlplane.api.exposure"):
        announce_exposure(ControllerSettings(host=host, port=18085, api_token=None))
    assert f"the API on {written}:18085 is open" in caplog.text
