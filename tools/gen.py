"""`make gen`: generate every client language's code from proto/ with buf.gen.yaml.

Runs `buf generate` with the plugins of each language whose toolchain is on this
machine; a language with a missing plugin is skipped with a message naming it (`make
client-tools` installs them, as root). The languages are told apart by their `out`.

    python -m tools.gen                  # every language that can be generated here
    python -m tools.gen --lang go cpp    # only these; a missing plugin is an error
    python -m tools.gen --lang python --out /tmp/x   # write under /tmp/x instead
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUF = ROOT / "node_modules/.bin/buf"
TEMPLATE = ROOT / "buf.gen.yaml"
# Each language's `out` in buf.gen.yaml; all but Python's are generated afresh.
OUTPUTS = {
    "python": "client",
    "go": "gen/go",
    "cpp": "gen/cpp",
    "java": "gen/java",
    "ts": "client/node/src/gen",
}
# Languages whose runtimes lack google.rpc.Status / BadRequest: they also get code for
# proto/third_party/google (Go has genproto, Python grpcio-status).
ERROR_DETAILS_FOR = ("cpp", "java", "ts")
# ORCA load reports (proto/third_party/xds): the server (Python) sends them; clients in
# other languages read them through their gRPC runtime's weighted_round_robin. Not from
# PyPI's xds-protos, which also writes over opentelemetry-proto's modules.
ORCA_FOR = ("python",)
INSTALL_HINT = {
    "python": "make install",
    "go": "make client-tools (apt: golang-go protoc-gen-go protoc-gen-go-grpc)",
    "cpp": "make client-tools (apt: protobuf-compiler protobuf-compiler-grpc libgrpc++-dev)",
    "java": "make client-tools (apt: protobuf-compiler protobuf-compiler-grpc-java-plugin libgrpc-java)",
    "ts": "make tools (npm ci in client/node)",
}


def language_of(plugin: dict) -> str:
    for language, out in OUTPUTS.items():
        if plugin["out"] == out:
            return language
    raise ValueError(f"buf.gen.yaml: no language writes to {plugin['out']!r} (tools/gen.py OUTPUTS)")


def missing_program(plugin: dict) -> str | None:
    """The plugin's program (or the protoc it needs) when it is not installed."""
    if "protoc_builtin" in plugin:
        command = plugin.get("protoc_path", "protoc")
    else:
        command = plugin["local"]
    program = command[0] if isinstance(command, list) else command
    if "/" in program:
        return None if (ROOT / program).exists() else program
    return None if shutil.which(program) else program


def plan(template: dict, wanted: list[str] | None) -> tuple[list[dict], dict[str, str]]:
    """The plugins to run and, for each skipped language, the program it lacks."""
    by_language: dict[str, list[dict]] = {}
    for plugin in template["plugins"]:
        by_language.setdefault(language_of(plugin), []).append(plugin)
    unknown = set(wanted or []) - set(by_language)
    if unknown:
        raise SystemExit(f"gen: unknown language(s) {sorted(unknown)}; known: {sorted(by_language)}")
    plugins: list[dict] = []
    skipped: dict[str, str] = {}
    for language, language_plugins in by_language.items():
        if wanted is not None and language not in wanted:
            continue
        lacking = [p for p in map(missing_program, language_plugins) if p]
        if lacking:
            skipped[language] = lacking[0]
        else:
            plugins.extend(language_plugins)
    return plugins, skipped


def buf_generate(template: dict, out: Path) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as filtered:
        json.dump(template, filtered)  # JSON is YAML
        filtered.flush()
        command = [str(BUF), "generate", "--template", filtered.name, "-o", str(out.resolve())]
        subprocess.run(command, cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lang", nargs="+", choices=sorted(OUTPUTS), help="only these languages")
    parser.add_argument("--out", type=Path, default=ROOT, help="base directory of the outputs (default: the repository)")
    args = parser.parse_args(argv)
    template = yaml.safe_load(TEMPLATE.read_text())
    plugins, skipped = plan(template, args.lang)
    for language, program in skipped.items():
        print(f"gen: skipping {language}: {program} not found; {INSTALL_HINT[language]}", file=sys.stderr)
    if args.lang and skipped:
        return 1
    if not plugins:
        return 0
    for language in sorted({language_of(p) for p in plugins} - {"python"}):
        shutil.rmtree(args.out / OUTPUTS[language], ignore_errors=True)
    buf_generate({**template, "plugins": plugins}, args.out)
    details_plugins = [p for p in plugins if language_of(p) in ERROR_DETAILS_FOR]
    if details_plugins:
        details_input = {"directory": "proto", "paths": ["proto/third_party/google"]}
        buf_generate({**template, "inputs": [details_input], "plugins": details_plugins}, args.out)
    orca_plugins = [p for p in plugins if language_of(p) in ORCA_FOR]
    if orca_plugins:
        orca_input = {"directory": "proto", "paths": ["proto/third_party/xds"]}
        buf_generate({**template, "inputs": [orca_input], "plugins": orca_plugins}, args.out)
    print("gen: wrote " + ", ".join(sorted({language_of(p) for p in plugins})), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
