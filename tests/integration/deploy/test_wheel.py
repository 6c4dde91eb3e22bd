"""The wheel as the Dockerfile installs it: built from the sources, installed without -e into a
fresh virtual environment, serving one gRPC Generate and one HTTP chat completion.

`make install` is editable, so the rest of the suite imports from the checkout and cannot see a
package the wheel leaves out. Here nothing comes from the checkout: the fresh environment holds
only the wheel, and its dependencies come from the project's .venv through a path line in a .pth
file. A path line adds the directory to sys.path but does not process the .pth files in it, so
the .venv's editable finder (installed by its own .pth) never runs; the test checks that too.
No network and no compiler: the wheel is built with --no-build-isolation by the .venv's setuptools.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmserve.client import Client

from harness.server import ROOT, RunningServer, free_port, start_server, stop_server

# What the Dockerfile's builder copies before `pip wheel --no-deps .`
SOURCES = ("pyproject.toml", "README.md", "service", "client")
PACKAGE_ROOTS = (("service", "llmserve"), ("client", "llmserve"), ("client", "xds"))  # (where, namespace)
IGNORED = shutil.ignore_patterns("node_modules", "__pycache__", "*.pyc", "*.egg-info", "build")

ORIGINS = """
import json, sys
import llmserve.client, llmserve.service, llmserve.service.domain.requests, llmserve.v1, xds.data.orca.v3
print(json.dumps({
    "service": llmserve.service.__file__, "client": llmserve.client.__file__,
    "requests": llmserve.service.domain.requests.__file__,
    "xds": list(xds.data.orca.v3.__path__),
    "finders": [getattr(f, "__module__", "") for f in sys.meta_path] + [str(p) for p in sys.path] + list(sys.modules),
}))
"""


def build_wheel(into: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the sources (a stale build/ in the checkout cannot leak in)."""
    src = into / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORED)
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--wheel-dir", str(into / "dist"), str(src)], check=True)
    (wheel,) = (into / "dist").glob("llmserve-*.whl")
    return wheel


def fresh_venv(at: Path, wheel: Path) -> Path:
    """A venv holding only the wheel (no -e); the .venv's site-packages as a plain path for the dependencies."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(at)], check=True)
    python = at / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    deps = sysconfig.get_path("purelib")  # this interpreter's: the project's .venv
    (Path(site) / "_llmserve_test_deps.pth").write_text(deps + "\n")
    return at


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, f"setuptools {setuptools.__version__} cannot build this pyproject: run `make install`"
    tmp = tmp_path_factory.mktemp("wheel")
    return fresh_venv(tmp / "venv", build_wheel(tmp))


@pytest.fixture(scope="module")
def wheel_server(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # No --chat-template-file: the chat completion below renders with the template the wheel ships
    running = start_server(["-np", "4", "-c", "8192", "-t", "2"], tmp_path_factory.mktemp("wheel-server") / "server.log",
                           http_port=free_port(), command=(str(venv / "bin" / "llmserve"),))
    yield running
    assert stop_server(running) == 0


def test_the_wheel_holds_every_module_of_the_sources(venv: Path) -> None:
    site = next(venv.glob("lib/python*/site-packages"))
    for where, namespace in PACKAGE_ROOTS:
        sources = {p.relative_to(ROOT / where) for p in (ROOT / where / namespace).rglob("*.py")}
        installed = {p.relative_to(site) for p in (site / namespace).rglob("*.py")}
        assert sources - installed == set(), f"the wheel leaves out {sorted(map(str, sources - installed))}"
    assert (site / "llmserve" / "client" / "service_config.json").is_file()  # package data
    assert (site / "llmserve" / "service" / "engine" / "chat" / "templates" / "gemma3.jinja").is_file()


def test_imports_come_from_the_fresh_environment_not_the_checkout(venv: Path, tmp_path: Path) -> None:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", ORIGINS], check=True, capture_output=True,
                         text=True, cwd=tmp_path).stdout
    got = json.loads(out)
    site = str(next(venv.glob("lib/python*/site-packages")))
    for name in ("service", "client", "requests"):
        assert got[name].startswith(site + "/"), f"{name} imported from {got[name]}, not {site}"
    assert all(p.startswith(site + "/") for p in got["xds"]), got["xds"]
    assert not any("editable" in f for f in got["finders"]), f"the editable install is active: {got['finders']}"


def test_the_installed_server_serves_grpc_and_http(wheel_server: RunningServer) -> None:
    with Client(wheel_server.address, timeout=60) as client:
        result = client.generate("Hello", max_tokens=3, ignore_eos=True)
    assert result.turn_end.usage.completion_tokens == 3
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, "ignore_eos": True}
    request = urllib.request.Request(f"http://127.0.0.1:{wheel_server.http_port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        chat = json.loads(reply.read())
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] == 3
    assert chat["choices"][0]["finish_reason"] == "length" and isinstance(chat["choices"][0]["message"]["content"], str)
