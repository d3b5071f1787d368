#!/usr/bin/env python3
"""imports.py [--dot] [--files]: the import graph of src/, checked for cycles.

Every `crate::a::b` and `super::...` path in a source file (outside its
`#[cfg(test)] mod tests`) is an edge from the file's module to the module it names.
Two granularities are checked, and both must be acyclic:
  - files: each file is a node (`src/store/redis/mod.rs` is `store::redis`);
  - top-level modules: `store::redis::waits` counts as `store`. An edge within one
    top-level module is not a cycle at this level.
An edge from a module to its own ancestor (a child using what its parent declares)
is counted: a parent that also uses the child makes a cycle, as it would for a reader.
`--dot` prints the top-level graph for Graphviz; `--files` prints the file graph.
Exits 1, naming each cycle, if there is one.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def module_of(path):
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def strip_tests(text):
    """Drops `#[cfg(test)] mod tests { ... }` blocks, comments and string literals."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def targets(module, text, modules):
    """The modules a file's paths name (the longest known prefix of each path)."""
    found = set()
    # `use crate::a::{b, c::d}` and inline `crate::a::b` paths; braces expanded one level.
    for m in re.finditer(r"\b(crate|super)((?:::\w+)+)(::\{([^}]*)\})?", text):
        base = [] if m.group(1) == "crate" else list(module[:-1])
        if m.group(1) == "super":
            # `super::super::x`
            rest = m.group(2).split("::")[1:]
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
        else:
            rest = m.group(2).split("::")[1:]
        paths = [base + rest]
        if m.group(4):
            for item in m.group(4).split(","):
                item = item.strip().split(" as ")[0]
                if item and item != "self":
                    paths.append(base + rest + [p for p in item.split("::") if p])
        for p in paths:
            for n in range(len(p), 0, -1):
                if tuple(p[:n]) in modules:
                    if tuple(p[:n]) != module:
                        found.add(tuple(p[:n]))
                    break
    return found


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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
    files = {module_of(p): p for p in SRC.rglob("*.rs")}
    modules = set(files)
    file_graph = {m: targets(m, strip_tests(p.read_text()), modules) for m, p in files.items()}
    top = lambda m: m[0] if m else "crate"
    top_graph = {}
    for m, ts in file_graph.items():
        for t in ts:
            if top(t) != top(m):
                top_graph.setdefault(top(m), set()).add(top(t))
    name = lambda m: "::".join(m) or "crate"
    if "--dot" in argv:
        print("digraph imports {")
        for m in sorted(top_graph):
            for t in sorted(top_graph[m]):
                print(f'  "{m}" -> "{t}";')
        print("}")
    if "--files" in argv:
        for m in sorted(file_graph, key=name):
            print(f"{name(m)} -> {', '.join(sorted(map(name, file_graph[m])))}")
    bad = False
    for level, graph, show in (("file", file_graph, name), ("top-level module", top_graph, str)):
        for comp in cycles(graph):
            bad = True
            members = set(comp)
            edges = sorted(f"{show(a)} -> {show(b)}" for a in comp for b in graph.get(a, ()) if b in members)
            print(f"import cycle between {level}s: {', '.join(map(show, comp))}\n  " + "\n  ".join(edges))
    if not bad:
        print(f"imports: no cycle ({len(file_graph)} files, {len(top_graph)} top-level modules with imports)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
