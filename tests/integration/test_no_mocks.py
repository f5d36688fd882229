"""Static check: tests that talk to Kubernetes use the real API server, never stand-ins.

Scans tests/e2e and tests/integration for mocking libraries, patched clients, fake HTTP
servers and fake Kubernetes clients.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["FORBIDDEN", "find_stand_ins"]

TESTS = Path(__file__).resolve().parents[1]
SCANNED = (TESTS / "e2e", TESTS / "integration")

#: (pattern, why it is forbidden)
FORBIDDEN: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), why)
    for p, why in (
        (r"\bunittest\.mock\b|from\s+unittest\s+import\s+mock\b", "unittest.mock"),
        (r"\b(Magic|Async|NonCallable)Mock\b", "mock objects"),
        (r"\bmock\.patch\b|\bpatch\.object\b|@patch\(", "patching"),
        (r"\bpytest_httpserver\b|\bhttpserver\b", "fake HTTP server"),
        (r"\bpytest_mock\b|\bmocker\b", "pytest-mock"),
        (r"^\s*(import|from)\s+(responses|respx|aioresponses|httpretty|vcr)\b", "HTTP stubbing"),
        (r"\bFake\w*(Client|Api|ApiServer|Kube\w*)\b|\bfake_(client|api|kube)\w*", "fake client"),
        (r"\bmonkeypatch\.setattr\b", "monkeypatching"),
    )
)


def find_stand_ins(paths: list[Path]) -> list[str]:
    """Return "file:line: why: text" for every forbidden construct in the given files."""
    hits: list[str] = []
    for path in paths:
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            for pattern, why in FORBIDDEN:
                if pattern.search(line):
                    hits.append(f"{path}:{lineno}: {why}: {line.strip()}")
    return hits


def _sources() -> list[Path]:
    me = Path(__file__).resolve()
    return sorted(
        p.resolve()
        for root in SCANNED
        if root.is_dir()
        for p in root.rglob("*.py")
        if p.resolve() != me
    )


def test_no_stand_ins_in_e2e_or_integration_tests() -> None:
    sources = _sources()
    assert sources, f"no test sources found under {[str(s) for s in SCANNED]}"
    hits = find_stand_ins(sources)
    assert not hits, "use the real control plane (testenv), not stand-ins:\n" + "\n".join(hits)


def test_scanner_catches_stand_ins(tmp_path: Path) -> None:
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "from unittest.mock import MagicMock\n"
        "client = MagicMock()\n"
        "def test_x(httpserver, mocker, monkeypatch):\n"
        "    monkeypatch.setattr(api, 'list_pods', lambda: [])\n"
        "    c = FakeKubeClient()\n"
    )
    good = tmp_path / "test_good.py"
    good.write_text("def test_y(control_plane):\n    control_plane.kubectl('get', 'pods')\n")
    hits = find_stand_ins([bad, good])
    assert len(hits) >= 5
    assert all("test_bad.py" in h for h in hits)
    assert {h.split(":")[1] for h in hits} == {"1", "2", "3", "4", "5"}
