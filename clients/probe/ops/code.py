"""ast_parse: an outline of a source file (Python by its own parser, a few languages by regex).

Confinement: the file is opened exactly as ``read`` opens it (``Confinement.open_file``).
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any, Dict, List

from ..confine import Confinement
from ..errors import ProbeError
from .base import Params

AST_MAX_BYTES = 5 * 1024 * 1024
_JS_FUNC = (
    r"^\s*(?:export\s+)?(?:default\s+)?(?:async\s+)?function\s*\*?\s*([A-Za-z_$][\w$]*)"
    r"|^\s*(?:export\s+)?(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?(?:\([^)]*\)|[A-Za-z_$][\w$]*)\s*=>"
)
_JAVA_MODIFIERS = r"(?:public|private|protected|static|final|abstract|synchronized|override|suspend|fun)"
OUTLINES = {
    # language: (extensions, function regex, class regex, import regex); best effort, line by line
    "javascript": (
        (".js", ".jsx", ".mjs", ".cjs", ".ts", ".tsx"),
        _JS_FUNC,
        r"^\s*(?:export\s+)?(?:default\s+)?(?:abstract\s+)?(?:class|interface)\s+([A-Za-z_$][\w$]*)",
        r"^\s*import\s.*?from\s+['\"]([^'\"]+)['\"]|^\s*import\s+['\"]([^'\"]+)['\"]"
        r"|require\(\s*['\"]([^'\"]+)['\"]\s*\)",
    ),
    "go": (
        (".go",),
        r"^func\s+(?:\([^)]*\)\s*)?([A-Za-z_]\w*)",
        r"^type\s+([A-Za-z_]\w*)\s+(?:struct|interface)",
        r'^\s*(?:import\s+)?(?:[A-Za-z_.]\w*\s+)?"([^"]+)"\s*$',
    ),
    "rust": (
        (".rs",),
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+([A-Za-z_]\w*)",
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct|enum|trait)\s+([A-Za-z_]\w*)",
        r"^\s*(?:pub\s+)?use\s+([^;]+);",
    ),
    "java": (
        (".java", ".kt", ".cs"),
        r"^\s*(?:" + _JAVA_MODIFIERS + r"\s+)+[\w<>\[\], ?]*?\b([A-Za-z_]\w*)\s*\(",
        r"^\s*(?:(?:public|private|protected|static|final|abstract|sealed|data|open)\s+)*"
        r"(?:class|interface|enum|record|object)\s+([A-Za-z_]\w*)",
        r"^\s*(?:import|using)\s+([\w.*]+)",
    ),
}


def op_ast_parse(conf: Confinement, p: Params) -> Dict[str, Any]:
    path = p.str("path")
    fd, real, info = conf.open_file(path)
    with os.fdopen(fd, "rb") as f:
        if info.st_size > AST_MAX_BYTES:
            raise ProbeError("too_large", f"{path} is larger than {AST_MAX_BYTES} bytes")
        data = f.read(AST_MAX_BYTES + 1)
    if b"\0" in data:
        raise ProbeError("is_binary", f"{path} is binary")
    extension = os.path.splitext(real)[1].lower()
    if extension in (".py", ".pyi", ".pyw") or data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        return _python_outline(real, data)
    for language, (extensions, functions, classes, imports) in OUTLINES.items():
        if extension in extensions:
            return _regex_outline(real, language, data.decode("utf-8", "replace"), functions, classes, imports)
    what = extension or "files without an extension"
    raise ProbeError("unsupported", f"no outline for {what}; Python files are parsed fully")


def _python_outline(real: str, data: bytes) -> Dict[str, Any]:
    try:
        tree = ast.parse(data, filename=real)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        message = getattr(exc, "msg", str(exc))
        raise ProbeError("parse_error", f"{os.path.basename(real)}:{line}: {message}") from None
    functions: List[Dict[str, Any]] = []
    classes: List[Dict[str, Any]] = []
    imports: List[Dict[str, Any]] = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                functions.append(
                    {
                        "name": child.name,
                        "qualname": qualname,
                        "line": child.lineno,
                        "end_line": getattr(child, "end_lineno", None),
                        "kind": "method" if in_class else "function",
                        "async": isinstance(child, ast.AsyncFunctionDef),
                    }
                )
                visit(child, qualname + ".<locals>.", False)
            elif isinstance(child, ast.ClassDef):
                qualname = prefix + child.name
                classes.append(
                    {
                        "name": child.name,
                        "qualname": qualname,
                        "line": child.lineno,
                        "end_line": getattr(child, "end_lineno", None),
                        "bases": [_unparse(base) for base in child.bases],
                    }
                )
                visit(child, qualname + ".", True)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    imports.append({"module": alias.name, "names": [], "line": child.lineno})
            elif isinstance(child, ast.ImportFrom):
                module = "." * (child.level or 0) + (child.module or "")
                imports.append({"module": module, "names": [a.name for a in child.names], "line": child.lineno})
            else:
                visit(child, prefix, in_class)

    visit(tree, "", False)
    return {
        "path": real,
        "language": "python",
        "outline": "ast",
        "functions": functions,
        "classes": classes,
        "imports": imports,
    }


def _unparse(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - a best-effort label only
        return type(node).__name__


def _regex_outline(real: str, language: str, text: str, functions: str, classes: str, imports: str) -> Dict[str, Any]:
    found: Dict[str, List[Dict[str, Any]]] = {"functions": [], "classes": [], "imports": []}
    patterns = {"functions": re.compile(functions), "classes": re.compile(classes), "imports": re.compile(imports)}
    for number, line in enumerate(text.split("\n"), 1):
        for key, regex in patterns.items():
            match = regex.search(line)
            if match:
                name = next((g for g in match.groups() if g), None)
                if not name:
                    continue
                if key == "imports":
                    found[key].append({"module": name.strip(), "names": [], "line": number})
                elif key == "functions":
                    kind = {"kind": "function", "async": "async" in line}
                    found[key].append({"name": name, "qualname": name, "line": number, "end_line": None, **kind})
                else:
                    found[key].append({"name": name, "qualname": name, "line": number, "end_line": None, "bases": []})
                break
    return {"path": real, "language": language, "outline": "regex", **found}
