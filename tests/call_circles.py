#!/usr/bin/env python3
"""Call circles between the files of the CPU build, read from the code itself.

    python3 tests/call_circles.py [ROOT]

The files are ROOT's top-level .c files and the .c files under ROOT/backend/, except
backend/cuda/ (the GPU build's). File A depends on file B when a function body (or an
initializer) of A names a non-static function that B defines: a call, or a function pointer
handed on. A function-like macro or a static inline function of a header counts where it is used:
`mpiCheck(...)` in A names `mpi_check` of utils.c. A circle is a strongly connected set of more
than one file: each of them reaches every other through such names. It prints every circle with
the names that tie it, and exits 1 when there is one (0 when there is none).

The parser is a tokenizer, not a compiler: comments, strings and preprocessor lines are dropped,
and both branches of an #if are read (a name only the GPU build defines has no definer here).
"""
import os
import re
import sys

KEYWORDS = set("""if else while for do switch case default return sizeof goto break continue
    typedef struct union enum static inline extern const volatile register restrict auto signed
    unsigned void char short int long float double _Bool _Atomic _Alignof _Static_assert
    __attribute__ __typeof__ typeof asm __asm__ defined""".split())
TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|\S")


def strip(text):
    """text without comments, string and char literals, and preprocessor lines (kept blank, so
    that line numbers stay); returns (code, macros): macros maps a function-like #define's name
    to the text of its body"""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * max(0, j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    macros, lines, cont = {}, code.split("\n"), False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            whole = line
            cont = line.rstrip().endswith("\\")
            lines[k] = ""
            m = re.match(r"\s*#\s*define\s+([A-Za-z_]\w*)\(", whole)
            if m:
                body, j = whole[m.end():], k
                while body.rstrip().endswith("\\") and j + 1 < len(lines):
                    j += 1
                    body = body.rstrip()[:-1] + " " + code.split("\n")[j]
                macros[m.group(1)] = body
    return "\n".join(lines), macros


def parse(path):
    """(defined, static_inline, used, macros) of one file: defined maps each non-static function
    it defines to True; static_inline maps each static function to the names its body uses; used
    is the set of names in its function bodies and initializers"""
    code, macros = strip(open(path, errors="replace").read())
    toks = TOKEN.findall(code)
    defined, statics, used = {}, {}, set()
    depth, start, body_of = 0, 0, None  # start: first token of the current top-level item
    for k, t in enumerate(toks):
        if t == "{":
            if depth == 0 and k > 0 and toks[k - 1] == ")":
                # a function definition: find the '(' that matches, the name before it
                level, j = 0, k - 1
                while j >= 0:
                    level += toks[j] == ")"
                    level -= toks[j] == "("
                    if level == 0:
                        break
                    j -= 1
                name = toks[j - 1] if j > 0 else ""
                if re.match(r"[A-Za-z_]\w*$", name) and name not in KEYWORDS:
                    if "static" in toks[start:j]:
                        body_of = statics.setdefault(name, set())
                    else:
                        defined[name] = True
                        body_of = None
            depth += 1
        elif t == "}":
            depth -= 1
            if depth == 0:
                start, body_of = k + 1, None
        elif t == ";" and depth == 0:
            start = k + 1
        elif depth > 0 and re.match(r"[A-Za-z_]\w*$", t) and t not in KEYWORDS:
            used.add(t)
            if body_of is not None:
                body_of.add(t)
    return defined, statics, used, macros


def names_in(text):
    return {t for t in TOKEN.findall(text) if re.match(r"[A-Za-z_]\w*$", t) and t not in KEYWORDS}


def sources(root):
    """the CPU build's .c files (relative paths) and the headers whose macros and static inline
    functions they may use"""
    cfiles, headers = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        if rel and not (rel == "backend" or rel.startswith("backend" + os.sep)):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if os.path.join(rel, d) != os.path.join("backend", "cuda"))
        for f in sorted(filenames):
            (cfiles if f.endswith(".c") else headers if f.endswith(".h") else []).append(
                os.path.join(rel, f))
    return cfiles, headers


def graph(root):
    """edges: {A: {B: sorted names}} between the .c files of root"""
    cfiles, headers = sources(root)
    header_macros, header_inline = {}, {}
    for h in headers:
        _, statics, _, macros = parse(os.path.join(root, h))
        header_macros.update({m: names_in(b) for m, b in macros.items()})
        header_inline.update(statics)
    info = {f: parse(os.path.join(root, f)) for f in cfiles}
    definers = {}
    for f, (defined, _, _, _) in info.items():
        for name in defined:
            definers.setdefault(name, []).append(f)
    edges = {f: {} for f in cfiles}
    for f, (defined, statics, used, macros) in info.items():
        # what the file's bodies name, with the macros and header inlines they use opened up
        # (how it got there: "name" or "name via MACRO")
        reached, todo = {}, [(u, None) for u in used]
        local_macros = {m: names_in(b) for m, b in macros.items()}
        while todo:
            name, via = todo.pop()
            if name in reached:
                continue
            reached[name] = via
            for table in (local_macros, header_macros, header_inline):
                if name in table and name not in defined and name not in statics:
                    todo += [(n, via or name) for n in table[name]]
                    break
        for name, via in reached.items():
            if name in defined or name in statics:
                continue  # its own function (a program's own helpers shadow nothing)
            for g in definers.get(name, []):
                if g != f:
                    label = name if via is None else "%s via %s" % (name, via)
                    edges[f].setdefault(g, set()).add(label)
    return cfiles, {f: {g: sorted(n) for g, n in out.items()} for f, out in edges.items()}


def circles(nodes, edges):
    """the strongly connected sets of more than one node (Tarjan's algorithm)"""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(found)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    nodes, edges = graph(root)
    found = circles(nodes, edges)
    print("%d files, %d file-to-file dependencies, %d circle%s" % (
        len(nodes), sum(len(out) for out in edges.values()), len(found),
        "" if len(found) == 1 else "s"))
    for number, group in enumerate(found, 1):
        print("circle %d: %s" % (number, " <-> ".join(group)))
        for a in group:
            for b in group:
                if b in edges[a]:
                    names = edges[a][b]
                    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
                    print("    %s -> %s: %s" % (a, b, shown))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
