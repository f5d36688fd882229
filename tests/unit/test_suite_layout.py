"""The test tree itself: pytest imports test files of folders without __init__.py by their
bare file name, so two such files with one name stop the whole run at collection (this
happened once with tests/unit and tests/integration each holding test_dra_commit.py)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_test_files_outside_packages_have_unique_names() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if (path.parent / "__init__.py").exists():
            continue  # imported as package.module, the folder keeps it apart
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
