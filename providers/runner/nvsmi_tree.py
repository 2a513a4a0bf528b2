"""The text of `nvidia-smi -q` as a tree of Nodes, and the error every dump reader raises.

Shape of the report (NVIDIA driver ≥ 470):

    ==============NVSMI LOG==============          banner (blank lines may come first)
    Driver Version                            : 535.183.01
    Attached GPUs                             : 8
    GPU 00000000:53:00.0                            one section per GPU, indent 0
        FB Memory Usage                             nested section, 4 more spaces
            Total                             : 81559 MiB

Every line is blank, a section header (text without " : ") or `key : value`, indented by a
multiple of 4 spaces and at most 4 deeper than the line before it (a `key : value` line may
have children: "HW Slowdown : Not Active" lists "HW Thermal Slowdown" under it). nvidia-smi
pads every key so that " : " falls in one column for the whole report (it begins in column
42 up to driver 580, 55 from 590: the key column is 38 or 51 wide); a line whose " : "
sits elsewhere although its key would fit is a corrupted line. Windows line endings and a
byte-order mark are accepted.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

BANNER = "==============NVSMI LOG=============="
INDENT = 4
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")
_SEP = " : "
#: Values meaning "nothing to report" (nvidia-smi prints both forms).
NOT_AVAILABLE = frozenset({"n/a", "[n/a]", "requested functionality has been deprecated",
                           "not supported", "[not supported]", "unknown error"})


class DumpError(ValueError):
    """A `nvidia-smi -q` report that cannot be trusted.

    path: the file name shown; line: 1-based line of the first problem; reason: what is wrong.
    str() is one line: "<path>:<line>: <reason>" (plus "; also line N: …" for other problems).
    """

    def __init__(self, path: str, line: int, reason: str, more: list[tuple[int, str]] = ()):
        self.path, self.line, self.reason = path, line, reason
        self.more = list(more)
        msg = f"{path}:{line}: {reason}"
        for other_line, other in self.more[:3]:
            msg += f"; also line {other_line}: {other}"
        if len(self.more) > 3:
            msg += f"; and {len(self.more) - 3} more problem(s)"
        super().__init__(msg)


@dataclass
class Node:
    """One line of the report: key, value (None for a section header), 1-based line, children."""

    key: str
    value: str | None
    line: int
    children: list[Node] = field(default_factory=list)

    def find(self, *path: str) -> Node | None:
        """The first descendant reached by following `path` keys, or None."""
        node: Node | None = self
        for key in path:
            node = next((c for c in node.children if c.key == key), None)
            if node is None:
                return None
        return node

    def value_at(self, *path: str) -> str | None:
        """The value of the node at `path`, or None when absent or a section header."""
        node = self.find(*path)
        return None if node is None else node.value

    def known_at(self, *path: str) -> str | None:
        """Like value_at, but None also for "N/A", "[N/A]" and the like (NOT_AVAILABLE)."""
        value = self.value_at(*path)
        return None if value is None or value.strip().lower() in NOT_AVAILABLE else value

    def all(self, key: str) -> list[Node]:
        """The children called `key`, in order."""
        return [c for c in self.children if c.key == key]


def indent_free(line: str) -> str:
    """The line without its indent and trailing blanks (a CR of a CRLF file included)."""
    return line.strip()


def first_content_line(text: str) -> tuple[int, str]:
    """(1-based number, stripped text) of the first non-blank line; (1, "") if none."""
    for number, raw in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        if raw.strip():
            return number, raw.strip()
    return 1, ""


def _parse_tree(text: str) -> tuple[Node, list[tuple[int, str]]]:
    """Build the indentation tree; return (root, problems) with problems as (line, reason)."""
    root = Node("", None, 0)
    problems: list[tuple[int, str]] = []
    lines = text.lstrip("\ufeff").splitlines()
    # The column where " : " sits in (nearly) every line: nvidia-smi pads keys to it.
    seps = Counter(ln.find(_SEP) for ln in lines if _SEP in ln)
    sep_col = seps.most_common(1)[0][0] if seps else -1
    stack: list[tuple[int, Node]] = [(-INDENT, root)]  # (indent, node)
    prev_indent = -INDENT  # indent of the last non-blank line; its children may go 4 deeper
    misaligned: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        if indent_free(raw) == BANNER:  # the banner (once, or once per concatenated report)
            continue
        if "\t" in raw:
            problems.append((number, "tab character; nvidia-smi indents with spaces only"))
            continue
        line = raw.rstrip()
        indent = len(line) - len(line.lstrip(" "))
        body = line[indent:]
        if indent % INDENT:
            problems.append((number, f"indented {indent} spaces, not a multiple of {INDENT}"))
            continue
        if indent > prev_indent + INDENT:
            problems.append(
                (number, f"indented {indent} spaces, more than {INDENT} deeper than the line above")
            )
            continue
        if _SEP in line:
            pos = line.find(_SEP)
            key, value = line[indent:pos].strip(), line[pos + len(_SEP) :].strip()
            if not key:
                problems.append((number, f"'key : value' line with an empty key: {body!r}"))
                continue
            expected = max(sep_col, indent + len(key))
            if pos != expected:
                misaligned.append(number)
        elif body.endswith(" :"):  # "key :" with an empty value
            key, value = body[:-2].strip(), ""
        elif ":" in body and not (indent == 0 and _GPU_HEADER.match(body)):
            problems.append((number, f"not 'key : value' nor a section header: {body!r}"))
            continue
        else:
            key, value = body, None
        while stack[-1][0] >= indent:
            stack.pop()
        node = Node(key, value, number)
        stack[-1][1].children.append(node)
        stack.append((indent, node))
        prev_indent = indent
    # Report runs of misaligned lines as one problem each.
    start = None
    for i, number in enumerate(misaligned):
        if start is None:
            start = number
        if i + 1 == len(misaligned) or misaligned[i + 1] != number + 1:
            where = f"lines {start}-{number}" if number != start else f"line {start}"
            problems.append(
                (
                    start,
                    f"corrupted {where}: ' : ' is not in column {sep_col + 2} where every "
                    "other line of the report puts it",
                )
            )
            start = None
    problems.sort(key=lambda p: p[0])
    return root, problems


