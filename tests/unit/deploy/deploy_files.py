"""Reading the deployment files for the tests: the Dockerfile (stages, ARG, ENV, RUN),
the Kubernetes manifests of deploy/k8s, and the LLMSERVE_* names the server reads."""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # the Kubernetes schemas (kubernetes-validate) the manifests must pass
SERVER_PY = ROOT / "service" / "llmserve" / "service" / "transport" / "server.py"
ENV_NAME = re.compile(r"LLMSERVE_[A-Z0-9_]+")
# Read by the server but not a `serve` flag: where the default model is assembled.
NON_FLAG_ENV = {"LLMSERVE_CACHE_DIR": ROOT / "service" / "llmserve" / "service" / "model" / "default_model.py"}


# -- the server's side ------------------------------------------------------------------


def serve_parser() -> argparse.ArgumentParser:
    from llmserve.service import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def subcommands() -> set[str]:
    from llmserve.service import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def flag_env_names() -> set[str]:
    """The variables `llmserve` reads for a flag of any subcommand (`serve`, and the
    client commands such as `health` that the image's HEALTHCHECK runs): their help
    names each one as "[env NAME]" (or "env NAME" in a sentence)."""
    from llmserve.service import cli

    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = set()
    for command in sub.choices.values():
        for action in command._actions:
            names.update(re.findall(r"\benv (LLMSERVE_[A-Z0-9_]+)", action.help or ""))
    return names


def module_constant(path: Path, name: str) -> Any:
    """A module-level `NAME = <literal>` of a source file, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path.name} has no module-level {name}")


# -- Dockerfile -------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for cmd, args in self.instructions if cmd == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, f"{keyword}: {found}"
        return found[0]

    def args(self) -> dict[str, str]:
        """ARG defaults, as the build sees them without --build-arg."""
        out = {}
        for text in self.all("ARG"):
            name, _, default = shlex.split(text)[0].partition("=")
            out[name] = default
        return out

    def env(self) -> dict[str, str]:
        out = {}
        for text in self.all("ENV"):
            for token in shlex.split(text):
                name, _, value = token.partition("=")
                out[name] = value
        return out


def dockerfile() -> tuple[dict[str, str], list[Stage]]:
    """(the ARGs declared before the first FROM, the stages in order)."""
    logical: list[str] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for text in logical:
        cmd, _, args = text.partition(" ")
        cmd, args = cmd.upper(), args.strip()
        if cmd == "FROM":
            words = args.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages and cmd == "ARG":
            name, _, default = shlex.split(args)[0].partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append((cmd, args))
    return global_args, stages


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list), f"not the exec (JSON) form: {text}"
    return value


def image_env() -> dict[str, str]:
    return dockerfile()[1][-1].env()


# -- Kubernetes -------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def base_resources() -> list[dict[str, Any]]:
    return [doc for name in kustomization()["resources"] for doc in documents(K8S / name)]


def resource(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in base_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} in the base"
    return found[0]


def container(deployment: str, name: str) -> dict[str, Any]:
    pod = resource("Deployment", deployment)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def container_env(deployment: str, name: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment, name).get("env", [])}


def effective_env() -> dict[str, str]:
    """What the llmserve container runs with: the image's ENV, then the pod's env."""
    return {**image_env(), **container_env("llmserve", "llmserve")}
