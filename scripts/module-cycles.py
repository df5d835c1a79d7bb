#!/usr/bin/env python3
"""Report cycles between the modules of each crate under crates/*/src.

A module is a source file (an inline `mod x { ... }` block counts as part of its file).
An edge A -> B means A's code names B through a `crate::`, `super::` or `self::` path, in
a `use` item or inline (`crate::jail::Cgroup::create`). References inside a
`#[cfg(test)] mod ... { ... }` block, in comments and in string literals are ignored.
A `#[path = "..."] mod x;` declaration is followed, so a file loaded that way is one node
whatever module name it is loaded under.

    python3 scripts/module-cycles.py                  # every crate
    python3 scripts/module-cycles.py gearbox-sandbox  # only these crates

Exits 1 and lists the cycles (one per strongly connected component, with the edges that
close it) when there are any, 0 otherwise. Python 3 standard library only.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip_code(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.match(r'(?:b|c)?r(#*)"', text[i:i + 260]) if c in "bcr" else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"' or (c in "bc" and text.startswith('"', i + 1)
                        and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", text[i:i + 16])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def strip_test_modules(code):
    """`code` without `#[cfg(test)] mod name { ... }` blocks."""
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pattern.search(code)
        if not m:
            return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
            j += 1
        code = code[:m.start()] + "\n" * code.count("\n", m.start(), j) + code[j:]


def expand_use(tree):
    """The paths of a use tree: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for k, ch in enumerate(tree):
        if ch == "{" and depth == 0:
            prefix, rest = tree[:k], tree[k + 1:]
            # The matching close brace is the last one.
            inner = rest[:rest.rfind("}")]
            parts, depth2, start = [], 0, 0
            for m, ch2 in enumerate(inner):
                if ch2 == "{":
                    depth2 += 1
                elif ch2 == "}":
                    depth2 -= 1
                elif ch2 == "," and depth2 == 0:
                    parts.append(inner[start:m])
                    start = m + 1
            parts.append(inner[start:])
            paths = []
            for p in parts:
                if p:
                    paths.extend(prefix + q for q in expand_use(p))
            return paths
    return [tree]


class Crate:
    def __init__(self, name, src):
        self.name = name
        self.src = src
        self.files = {}  # module path (tuple) -> file
        self.modules = {}  # file -> canonical module path
        self.aliases = {}  # module path -> file, for `#[path]` modules

    def module_of_file(self, path):
        rel = os.path.relpath(path, self.src)
        parts = rel[:-3].split(os.sep)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        return tuple(parts)

    def load(self):
        for dirpath, _, names in os.walk(self.src):
            for name in names:
                if name.endswith(".rs"):
                    path = os.path.join(dirpath, name)
                    mod = self.module_of_file(path)
                    # lib.rs and main.rs are both the root; the first one wins.
                    if mod in self.files and not path.endswith(("lib.rs", "mod.rs")):
                        continue
                    self.files[mod] = path
                    self.modules[path] = mod
        for path in list(self.modules):
            for m in re.finditer(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;',
                                 open(path, encoding="utf-8").read()):
                target = os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
                self.aliases[self.modules[path] + (m.group(2),)] = target

    def resolve(self, path, segments):
        """The file a `crate::`/`super::`/`self::` path starting in `path` names, or None."""
        here = self.modules[path]
        if segments[0] == "crate":
            base, rest = (), segments[1:]
        else:
            base, rest = here, segments
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        best = None
        for k in range(len(rest), -1, -1):
            mod = base + tuple(rest[:k])
            target = self.aliases.get(mod) or self.files.get(mod)
            if target:
                best = target
                break
        return best

    def edges(self):
        graph = {f: set() for f in self.modules}
        for path in self.modules:
            code = strip_test_modules(strip_code(open(path, encoding="utf-8").read()))
            refs = []
            for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", code):
                refs.extend(expand_use(m.group(1)))
            inline = re.sub(r"\buse\s+[^;]*;", "", code)
            refs.extend(m.group(0) for m in re.finditer(r"\b(?:crate|super|self)(?:\s*::\s*\w+)+", inline))
            for ref in refs:
                segments = [s for s in re.sub(r"\s+", "", ref).split("::") if s and s != "*"]
                if not segments or segments == ["self"]:
                    continue
                target = self.resolve(path, segments)
                if target and target != path and target in graph:
                    graph[path].add(target)
        return graph


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main(argv):
    wanted = set(argv[1:])
    crates_dir = os.path.join(ROOT, "crates")
    names = sorted(d for d in os.listdir(crates_dir) if os.path.isdir(os.path.join(crates_dir, d, "src")))
    unknown = wanted - set(names)
    if unknown:
        print("no such crate: " + ", ".join(sorted(unknown)), file=sys.stderr)
        return 2
    found = False
    for name in names:
        if wanted and name not in wanted:
            continue
        crate = Crate(name, os.path.join(crates_dir, name, "src"))
        crate.load()
        graph = crate.edges()
        for comp in cycles(graph):
            found = True
            rel = lambda f: os.path.relpath(f, crate.src)
            print(f"{name}: cycle between " + ", ".join(rel(f) for f in comp))
            members = set(comp)
            for f in comp:
                for t in sorted(graph[f] & members):
                    print(f"  {rel(f)} -> {rel(t)}")
    if not found:
        print("no module cycles in " + (", ".join(sorted(wanted)) if wanted else "any crate"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
