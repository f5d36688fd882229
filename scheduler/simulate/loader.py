"""Reading the simulator's input files: text checks, a strict and fast YAML loader.

- A file that is not UTF-8 text (a binary, an image, a compressed trace) is refused with one
  line naming the file and the offset of the first bad byte, instead of a decoding traceback.
- YAML is parsed by libyaml's C parser (``yaml.CSafeLoader``) when PyYAML was built with it
  (about 3x faster than the pure-Python parser on a 5 MB scenario), else by ``SafeLoader``.
- A key given twice in one mapping (two ``jobs:`` sections) is an error naming both lines: plain
  YAML loaders keep the last one and silently drop the first, with all its jobs.

Errors raise :class:`~scheduler.simulate.fields.ScenarioError` whose field is the file path.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode

from scheduler.simulate.fields import ScenarioError

__all__ = [
    "C_LOADER",
    "DuplicateKeyError",
    "StrictLoader",
    "check_text_file",
    "load_documents",
    "read_text",
]

#: True when the C parser is used (PyYAML built against libyaml).
C_LOADER = hasattr(yaml, "CSafeLoader")
_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
#: Bytes of a file looked at for NUL bytes (a text file has none; most binaries do early on).
_SNIFF = 8192


class DuplicateKeyError(ConstructorError):
    """A mapping that names the same key twice."""


class StrictLoader(_Base):  # type: ignore[valid-type,misc]
    """A safe loader (C parser when available) that rejects duplicate mapping keys."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Hashable, Any]:
        """As SafeLoader's, after checking that no key repeats (merge keys ``<<`` excepted,
        whose overriding is what they are for)."""
        if isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, _value in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                # A scalar key is its resolved tag and text (cheap: constructing every key
                # twice made loading a 5 MB scenario much slower); others are constructed.
                key = (
                    (key_node.tag, key_node.value)
                    if isinstance(key_node, ScalarNode)
                    else self.construct_object(key_node, deep=True)
                )
                try:
                    earlier = first.get(key)
                except TypeError:
                    continue  # unhashable: the base constructor reports it
                if earlier is not None:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"key {_shown(key)!r} appears twice in the same mapping (first on line "
                        f"{earlier.start_mark.line + 1}); YAML would keep only the last one, "
                        "so merge the two into one or rename one",
                        key_node.start_mark,
                    )
                first[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def _shown(key: Any) -> Any:
    """The key as written (scalar keys are kept as (tag, text) pairs)."""
    return key[1] if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], str) else key


def read_text(path: str | Path, *, what: str = "") -> str:
    """The file's text; a missing, unreadable or binary file raises :class:`ScenarioError`
    (``what`` names the flag the path came from, e.g. ``--pods``)."""
    p = Path(path)
    label = f"{what} {p}" if what else str(p)
    try:
        data = p.read_bytes()
    except IsADirectoryError as e:
        raise ScenarioError(label, "is a directory; give a file") from e
    except OSError as e:
        raise ScenarioError(label, f"cannot read the file: {e.strerror or e}") from e
    nul = data.find(b"\x00", 0, _SNIFF)
    if nul >= 0:
        raise ScenarioError(label, _not_text(f"it has a NUL byte at offset {nul}", what))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(
            label, _not_text(f"byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8", what)
        ) from e


def _not_text(why: str, what: str) -> str:
    expected = "an openb CSV file" if what in ("--nodes", "--pods") else "a YAML file"
    return f"is not a text file ({why}); give {expected}"


def check_text_file(path: str | Path, what: str) -> None:
    """Raise :class:`ScenarioError` unless ``path`` is a readable UTF-8 text file."""
    read_text(path, what=what)


def load_documents(path: str | Path) -> list[Any]:
    """Every non-empty YAML document of the file, in order (``---`` separates them)."""
    text = read_text(path)
    try:
        return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        if isinstance(e, DuplicateKeyError):
            raise ScenarioError(str(path), f"{where}{problem}") from e
        raise ScenarioError(str(path), f"{where}not valid YAML ({problem})") from e
