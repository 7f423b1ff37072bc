"""A small, strict unified-diff applier for one file.

Every hunk's context and removed lines must match the file exactly (no fuzz). A hunk may sit at
another line than its header says (as with ``patch``), the nearest exact match wins; a hunk that
matches nowhere refuses the whole diff and nothing is written.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from .errors import ProbeError

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_EOL = "\\ No newline at end of file"


class Hunk:
    def __init__(
        self, old_start: int, old: List[str], new: List[str], old_eol: Optional[bool], new_eol: Optional[bool]
    ):
        self.old_start = old_start
        self.old = old
        self.new = new
        # None: this hunk does not touch the end of the file's newline
        self.old_eol = old_eol
        self.new_eol = new_eol


def _refuse(detail: str) -> ProbeError:
    return ProbeError("diff_does_not_apply", detail)


def parse(diff: str) -> Tuple[bool, List[Hunk]]:
    """(creates a new file, hunks)."""
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    i = 0
    creates = False
    files = 0
    hunks: List[Hunk] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files += 1
            if files > 1:
                raise ProbeError("invalid_argument", "the diff must change exactly one file")
            creates = line[4:].split("\t")[0].strip() == "/dev/null"
            i += 2
            continue
        match = HUNK.match(line)
        if not match:
            i += 1  # headers such as "diff --git", "index ..." are skipped
            continue
        old_len = int(match.group(2)) if match.group(2) is not None else 1
        new_len = int(match.group(4)) if match.group(4) is not None else 1
        old: List[str] = []
        new: List[str] = []
        old_eol: Optional[bool] = None
        new_eol: Optional[bool] = None
        last = ""
        i += 1
        while i < len(lines) and (len(old) < old_len or len(new) < new_len or lines[i] == NO_EOL):
            text = lines[i]
            if text == NO_EOL:
                if last in (" ", "-"):
                    old_eol = False
                if last in (" ", "+"):
                    new_eol = False
                i += 1
                continue
            tag, body = (text[:1], text[1:]) if text else (" ", "")
            if tag == " ":
                old.append(body)
                new.append(body)
            elif tag == "-":
                old.append(body)
            elif tag == "+":
                new.append(body)
            else:
                raise ProbeError("invalid_argument", f"malformed hunk line: {text[:80]!r}")
            last = tag
            i += 1
        if len(old) != old_len or len(new) != new_len:
            raise ProbeError("invalid_argument", "a hunk is shorter than its header says")
        hunks.append(Hunk(int(match.group(1)), old, new, old_eol, new_eol))
    if not hunks:
        raise ProbeError("invalid_argument", "the diff has no hunks")
    return creates, hunks


def apply(original: Optional[str], diff: str) -> str:
    """The new text. ``original`` is None when the file does not exist yet."""
    creates, hunks = parse(diff)
    if creates and original is not None:
        raise _refuse("the diff creates the file, but it exists already")
    if not creates and original is None:
        raise ProbeError("not_found", "the file the diff changes does not exist")
    text = original or ""
    lines = text.split("\n")
    eol = text.endswith("\n") or text == ""
    if text.endswith("\n") or text == "":
        lines.pop()
    result: List[str] = []
    cursor = 0  # index in `lines` up to which the file has been copied
    for number, hunk in enumerate(hunks, 1):
        wanted = max(hunk.old_start - 1, 0) if hunk.old else hunk.old_start
        at = _find(lines, hunk.old, wanted, cursor)
        if at is None:
            raise _refuse(f"hunk {number} (at line {hunk.old_start}) does not match the file")
        touches_end = at + len(hunk.old) == len(lines)
        if hunk.old_eol is False and not (touches_end and not eol):
            raise _refuse(f"hunk {number}: the file does end with a newline")
        result.extend(lines[cursor:at])
        result.extend(hunk.new)
        cursor = at + len(hunk.old)
        if touches_end:
            if hunk.new_eol is False:
                eol = False
            elif hunk.old_eol is False or not lines:
                eol = True
    result.extend(lines[cursor:])
    out = "\n".join(result)
    return out + "\n" if eol and result else out


def _find(lines: List[str], block: List[str], wanted: int, start: int) -> Optional[int]:
    """The position nearest `wanted` (not before `start`) where `block` matches exactly."""
    last = len(lines) - len(block)
    if last < start:
        return None
    for delta in range(0, len(lines) + 1):
        for at in (wanted - delta, wanted + delta) if delta else (wanted,):
            if start <= at <= last and lines[at : at + len(block)] == block:
                return at
    return None
