""".gitignore matching (the subset the probe honours) and grep's ``glob`` filter.

Supported: comments, blank lines, ``\\`` escapes, ``!`` negation, trailing ``/`` (directories only),
anchored patterns (a ``/`` at the start or in the middle), ``*``, ``?``, ``[...]`` and ``**`` (leading
``**/``, trailing ``/**``, middle ``/**/``). Like git, the last matching line of the deepest
.gitignore decides, and nothing below an ignored directory is looked at.
"""

from __future__ import annotations

import re
from typing import List, Optional, Pattern, Tuple


def translate(pattern: str) -> str:
    """A gitignore glob (without negation or trailing slash) to a regex body; ``/`` is never matched by ``*``."""
    out: List[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                if pattern.startswith("**/", i):
                    out.append("(?:.*/)?")
                    i += 3
                    continue
                out.append(".*")
                i += 2
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


class Rule:
    __slots__ = ("negated", "dir_only", "anchored", "regex")

    def __init__(self, line: str) -> None:
        self.negated = line.startswith("!")
        if self.negated:
            line = line[1:]
        self.dir_only = line.endswith("/")
        line = line.rstrip("/")
        self.anchored = "/" in line
        line = line.lstrip("/")
        self.regex: Pattern[str] = re.compile(translate(line) + r"\Z", re.DOTALL)

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return self.regex.match(rel) is not None
        return self.regex.match(rel.rsplit("/", 1)[-1]) is not None


def parse(text: str) -> List[Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\n\r")
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        if line.startswith(("\\#", "\\!")):
            line = line[1:]
            rules.append(Rule("\\" + line if line.startswith("!") else line))
            continue
        if line in ("!", "/", "!/"):
            continue
        rules.append(Rule(line))
    return rules


class IgnoreStack:
    """The .gitignore files met on the way down, deepest last: ``(base relative dir, rules)``."""

    def __init__(self, frames: Optional[List[Tuple[str, List[Rule]]]] = None) -> None:
        self.frames = frames or []

    def push(self, base: str, rules: List[Rule]) -> IgnoreStack:
        return IgnoreStack(self.frames + [(base, rules)]) if rules else self

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for base, rules in reversed(self.frames):
            sub = rel[len(base) + 1 :] if base else rel
            for rule in reversed(rules):
                if rule.matches(sub, is_dir):
                    return not rule.negated
        return False


class Glob:
    """grep's ``glob``: a gitignore-style pattern a file must match; ``!pattern`` excludes instead."""

    def __init__(self, pattern: str) -> None:
        self.exclude = pattern.startswith("!")
        self.rule = Rule(pattern[1:] if self.exclude else pattern)

    def admits(self, rel: str) -> bool:
        return self.rule.matches(rel, False) != self.exclude
