"""A server's Prometheus samples (/metrics on its --metrics-port), read as the tests, the
soaks and the Envoy cluster read them.

A sample is named as the exposition writes it, with or without labels:
`llmserve_sessions`, `llmserve_requests_total{code="OK",rpc="Generate"}`; labels may also be
given as keywords (`code="OK"`). A name the server does not export at all (renamed, removed)
always raises LookupError. `metric` raises for a missing sample too; `counted` reads 0 for a
labelled sample whose family is exported but which has not been counted yet
(prometheus_client exports a labelled child only once it is first used)."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(?P<labels>.*)\})?\s*$")
_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created", "_info")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _split(sample: str, labels: dict[str, str]) -> tuple[str, Labels]:
    match = _SAMPLE.match(sample)
    if match is None:
        raise ValueError(f"not a sample name: {sample!r}")
    inline = dict(_LABEL.findall(match.group("labels") or ""))
    return match.group("name"), frozenset({**inline, **labels}.items())


class Scrape:
    """One /metrics page, parsed: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, Labels], float] = {}
        self.families: set[str] = set()
        for family in text_string_to_metric_families(text):
            self.families.add(family.name)
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = float(s.value)

    def _known(self, name: str) -> bool:
        """Whether `name` belongs to an exported family (a counter's `_total`, a histogram's
        `_count`, `_sum` and `_bucket` are samples of the family without the suffix)."""
        return any(name == f or name in (f + s for s in _SUFFIXES) for f in self.families)

    def has(self, sample: str, **labels: str) -> bool:
        return _split(sample, labels) in self.samples

    def metric(self, sample: str, **labels: str) -> float:
        """The sample's value; LookupError when the page lacks it."""
        key = _split(sample, labels)
        if key not in self.samples:
            raise LookupError(f"no metric sample {sample!r}{' ' + str(labels) if labels else ''} in /metrics")
        return self.samples[key]

    def counted(self, sample: str, **labels: str) -> float:
        """The sample's value, 0 while its family is exported but this label set not yet."""
        name, wanted = _split(sample, labels)
        if (name, wanted) in self.samples:
            return self.samples[(name, wanted)]
        if not self._known(name):
            raise LookupError(f"no metric {name!r} in /metrics")
        return 0.0

    def total(self, name: str, **labels: str) -> float:
        """The sum over every label set of `name` that holds `labels` (0 when none does yet)."""
        if not self._known(name):
            raise LookupError(f"no metric {name!r} in /metrics")
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and wanted <= ls)


def scrape(port: int | None, timeout: float = 10) -> Scrape:
    """The server's /metrics page now."""
    assert port is not None, "the server was started without a metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        return Scrape(response.read().decode())


def metric(port: int | None, sample: str, **labels: str) -> float:
    """A sample's value now; LookupError when /metrics lacks it."""
    return scrape(port).metric(sample, **labels)


def counted(port: int | None, sample: str, **labels: str) -> float:
    """A sample's value now, 0 for a labelled one not counted yet (see the module's docstring)."""
    return scrape(port).counted(sample, **labels)


def total(port: int | None, name: str, **labels: str) -> float:
    """The sum of `name` over its label sets that hold `labels`, now."""
    return scrape(port).total(name, **labels)
