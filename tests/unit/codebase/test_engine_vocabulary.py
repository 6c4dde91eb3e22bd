"""The engine speaks its own words (domain/errors.py): engine/ and domain/ import no gRPC
and name no gRPC status and no proto field path in a string or a comment (read with ast
and tokenize); each surface spells every failure kind and field."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import grpc
from llmserve.service.domain.errors import FailureKind, Field, spelled
from llmserve.service.http import errors as http_errors
from llmserve.service.transport import errors as grpc_errors
from llmserve.v1 import llmserve_pb2 as pb

SERVICE = Path(__file__).resolve().parents[3] / "service" / "llmserve" / "service"
WINGS = ("engine", "domain")
# Words the engine has of its own: a turn that ends CANCELLED is a FinishReason.
OWN_WORDS = {"OK", "CANCELLED"}
STATUS_NAMES = {code.name for code in grpc.StatusCode} - OWN_WORDS


def _sources() -> list[Path]:
    files = [p for wing in WINGS for p in sorted((SERVICE / wing).rglob("*.py"))]
    assert len(files) > 30
    return files


def _field_paths(desc, prefix: str = "", seen: tuple[str, ...] = ()) -> set[str]:  # type: ignore[no-untyped-def]
    """Every dotted path into a request message: config.stopping.max_tokens, input.messages, ..."""
    found: set[str] = set()
    for field in desc.fields:
        path = prefix + field.name
        found.add(path)
        kind = field.message_type
        if kind is not None and kind.full_name not in seen:
            found |= _field_paths(kind, path + ".", (*seen, kind.full_name))
    return found


PROTO_PATHS = {p for name, d in pb.DESCRIPTOR.message_types_by_name.items() if name.endswith("Request")
               for p in _field_paths(d) if "." in p}


def _texts(path: Path) -> list[str]:
    """The file's string constants (docstrings too) and comments."""
    source = path.read_text()
    strings = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return strings + comments


def test_the_engine_imports_no_grpc() -> None:
    problems = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            problems += [f"{path.name} imports {n}" for n in names
                         if n.split(".")[0] in ("grpc", "grpc_status", "grpc_health") or n.startswith(("llmserve.v1", "google.rpc"))]
    assert not problems, problems


def test_the_engine_names_no_grpc_status_and_no_proto_path() -> None:
    assert {"config.stopping.max_tokens", "input.messages", "config.session_id"} <= PROTO_PATHS
    status = re.compile(r"\b(" + "|".join(sorted(STATUS_NAMES)) + r")\b")
    path = re.compile(r"(?<![\w.])(" + "|".join(re.escape(p) for p in sorted(PROTO_PATHS, key=len, reverse=True)) + r")\b")
    problems = []
    for source in _sources():
        for text in _texts(source):
            problems += [f"{source.name}: status name {m}" for m in status.findall(text)]
            problems += [f"{source.name}: proto path {m!r}" for m in path.findall(text)]
    assert not problems, problems


def test_a_status_name_or_a_proto_path_is_caught() -> None:
    status = re.compile(r"\b(" + "|".join(sorted(STATUS_NAMES)) + r")\b")
    assert status.findall('fail(s, "DEADLINE_EXCEEDED", "late")') == ["DEADLINE_EXCEEDED"]
    assert not status.findall("FinishReason.CANCELLED")
    assert "config.stopping.max_tokens" in PROTO_PATHS and "end_of_turn" not in PROTO_PATHS


def test_each_surface_maps_every_failure_kind_and_field_once() -> None:
    assert set(grpc_errors._OF_FAILURE) == set(FailureKind) == set(http_errors._OF_FAILURE)
    assert set(grpc_errors.FIELD_NAMES) == set(Field) == set(http_errors.FIELD_NAMES)
    grpc_paths = PROTO_PATHS | {d.name for d in pb.GenerateRequest.DESCRIPTOR.fields}
    assert set(grpc_errors.FIELD_NAMES.values()) <= grpc_paths  # real paths of the gRPC request
    role = Field.MESSAGES.at(2, "role")
    assert spelled(role, grpc_errors.FIELD_NAMES) == "input.messages[2].role"
    assert spelled(role, http_errors.FIELD_NAMES) == "messages[2].role"
    assert spelled(Field.MAX_TOKENS, grpc_errors.FIELD_NAMES) == "config.stopping.max_tokens"
    assert spelled(Field.MAX_TOKENS, http_errors.FIELD_NAMES) == "max_tokens"
    assert spelled("temperature", http_errors.FIELD_NAMES) == "temperature"  # a surface's own name stays
    assert spelled(None, grpc_errors.FIELD_NAMES) is None


def test_a_failure_kind_is_a_status_and_an_http_error() -> None:
    expected = {FailureKind.INVALID: ("INVALID_ARGUMENT", 400), FailureKind.DEADLINE: ("DEADLINE_EXCEEDED", 408),
                FailureKind.SHUTDOWN: ("UNAVAILABLE", 503), FailureKind.INTERNAL: ("INTERNAL", 500)}
    for kind, (status, http_status) in expected.items():
        assert grpc_errors.error_from_failure(kind, "m").code.name == status
        error = http_errors.from_failure(kind, "m")
        assert error.status == http_status and error.message == "m"
        assert error.retry_after_s == (1.0 if http_status == 503 else None)
