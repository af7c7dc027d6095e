#!/usr/bin/env python3
"""Every name and file the docs cite exists in the code.

    python3 tests/citations.py [--root ROOT] DOC.md...

A doc cites code in backticks, outside fenced blocks. What it checks, against the repo at ROOT
(the current folder by default):

  functions  `name()`, `name(args)`, `name<...>` and `name<<<...>>>`, every identifier in a cell
             of a table's `read` column, and the first name of each item of a list that follows a
             line starting "Read": each must be a function, macro or type defined in a .c, .h,
             .cu, .cc, .sh or .py file of the repo, or a library function the code calls. When
             the doc gives the arguments as plain names and the repo defines the function once
             in C, their number must be the definition's.
  names      any other `identifier_with_an_underscore` (alone, or a part of `a.b` or `a->b`): the
             word must occur in some .c, .h, .cu, .cc, .sh or .py file (comments included, so a
             config key or a struct field passes; a name nothing in the code has does not).
  files      `path` with a / or ending in .c .h .cu .sh .py .md: a file or folder of the repo,
             relative to the root or to the doc (a bare name: a file of that name anywhere in the
             repo); paths under tmp/ or $OUT, with placeholders (<...>, *, {...}) or spaces are
             what a run writes, not the repo's. And every relative link [text](path#anchor) of a
             doc must lead to a file, and to a heading of it when it names one.

Names of other projects that the docs quote (picotron's, PyTorch's, ...) are listed in FOREIGN
below, each with its origin. It prints how many of each kind it checked and every missing one as
FILE:LINE, and exits 1 when one is missing.
"""
import os
import re
import sys

# names and files of the projects the docs compare with: not this repo's
FOREIGN = {
    # picotron and picotron_tutorial
    "submit_slurm_jobs.py", "extract_metrics.py", "data_parallel.py", "train.py",
    # PyTorch, transformers, safetensors
    "repeat_interleave", "F.cross_entropy", "from_pretrained", "load_file",
    # Megatron-LM
    "get_model_chunk_id",
    # llm.c
    "train_gpt2.c",
    # NCCL's environment variables for multi-node runs (tutorial/07_slurm.md)
    "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_DEBUG",
}
# this checker and its test, which name made-up functions on purpose: not code to cite
SELF = {"tests/citations.py", "tests/t_91_citations.sh"}
# folders a build or a run writes: cited as what appears there, not as files of the repo
WRITTEN = ("tmp/", "build/", "build-", "bundle/")
CODE_EXT = (".c", ".h", ".cu", ".cc", ".sh", ".py")
PATH_EXT = (".c", ".h", ".cu", ".sh", ".py", ".md")
IDENT = re.compile(r"[A-Za-z_]\w*")
C_KEYWORDS = set("""if else while for do switch case return sizeof struct union enum typedef
    static inline extern const void int char float double long short unsigned signed""".split())


def strip_c(text):
    """C or C++ text without comments and literals (line count kept)"""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text,
                  flags=re.S)


def repo_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and
                             not d.startswith("build") and d not in ("tmp", "bundle"))
        for f in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def c_params(args):
    """the number of parameters of a C parameter list, None when variadic"""
    args = args.strip()
    if args in ("", "void"):
        return 0
    if "..." in args:
        return None
    depth, count = 0, 1
    for ch in args:
        depth += ch in "(["
        depth -= ch in ")]"
        count += ch == "," and depth == 0
    return count


def code_index(root, files):
    """defined: names a file defines; arity: {name: set of parameter counts} of C definitions;
    called: names the C code calls; words: every word of the code files"""
    defined, arity, called, words = set(), {}, set(), set()
    for rel in files:
        if not rel.endswith(CODE_EXT) and rel != "Makefile" or rel in SELF:
            continue
        try:
            text = open(os.path.join(root, rel), errors="replace").read()
        except OSError:
            continue
        words.update(IDENT.findall(text))
        if rel == "Makefile":
            continue
        if rel.endswith(".sh"):
            defined.update(re.findall(r"^\s*(?:function\s+)?([A-Za-z_]\w*)\s*\(\)\s*\{", text, re.M))
            continue
        if rel.endswith(".py"):
            defined.update(re.findall(r"^\s*(?:def|class)\s+([A-Za-z_]\w*)", text, re.M))
            continue
        code = strip_c(text)
        defined.update(re.findall(r"^\s*#\s*define\s+([A-Za-z_]\w*)", code, re.M))
        defined.update(re.findall(r"\b(?:struct|union|enum)\s+([A-Za-z_]\w*)", code))
        defined.update(re.findall(r"\}\s*([A-Za-z_]\w*)\s*;", code))  # typedef struct {...} Name;
        defined.update(re.findall(r"\btypedef\b[^;{]*?\b([A-Za-z_]\w*)\s*;", code))
        for body in re.findall(r"\benum\b[^{;]*\{([^}]*)\}", code):  # enum constants
            defined.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=[^,]*)?(?:,|$)", body))
        # function definitions: a name, its parameters, then a body (qualifiers between)
        for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)"
                             r"\s*(?:const\s*)?(?:__attribute__\s*\(\([^)]*\)\)\s*)?\{", code):
            name = m.group(1)
            if name in C_KEYWORDS or name in ("if", "while", "for", "switch"):
                continue
            defined.add(name)
            arity.setdefault(name, []).append(c_params(m.group(2)))
        called.update(m.group(1) for m in re.finditer(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;]*>\s*)?\(", code))
    return defined, arity, called, words


def anchors(path):
    """the anchors of a markdown file's headings, as GitHub makes them"""
    out, fenced = set(), False
    for line in open(path, errors="replace").read().split("\n"):
        fenced ^= line.lstrip().startswith("```")
        m = not fenced and re.match(r"#+\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def closes_at_end(s, i):
    """whether the parenthesis at s[i] closes at the end of s"""
    depth = 0
    for j in range(i, len(s)):
        depth += s[j] == "("
        depth -= s[j] == ")"
        if depth == 0:
            return j == len(s) - 1
    return False


def doc_spans(text):
    """(span, offset, kind) for each inline code span outside fenced blocks, kind "read" when it
    sits in a read column or starts an item of a Read list; and (target, offset) of each link"""
    lines = text.split("\n")
    fenced, inside = [], False
    for line in lines:
        if line.lstrip().startswith("```"):
            inside = not inside
            fenced.append(True)
        else:
            fenced.append(inside)
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    spans, links = [], []
    read_col, read_list, first_in_item = None, False, False
    for k, line in enumerate(lines):
        if fenced[k]:
            read_col, read_list = None, False
            continue
        # the table's read column
        if line.lstrip().startswith("|"):
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            if read_col is None and any(c.strip().strip("`").lower() == "read" for c in cells):
                read_col = [c.strip().strip("`").lower() for c in cells].index("read")
                header = True
            else:
                header = False
        else:
            read_col, header = None, False
            cells = None
        if re.match(r"Read\b", line):
            read_list = True
        elif read_list and not line.strip():
            pass
        elif read_list and not re.match(r"\s*(?:[-*]|\d+\.) |\s{2,}\S", line):
            read_list = False
        col_range = None
        if read_col is not None and not header and cells is not None and read_col < len(cells):
            start = 0
            bars = [m.start() for m in re.finditer(r"(?<!\\)\|", line)]
            if read_col + 1 < len(bars):
                col_range = (bars[read_col], bars[read_col + 1])
        if read_list and re.match(r"\s*(?:[-*]|\d+\.) ", line):
            first_in_item = True  # a new item of the Read list
        elif not read_list:
            first_in_item = False
        for m in re.finditer(r"`([^`\n]+)`", line):
            kind = "plain"
            if col_range and col_range[0] < m.start() < col_range[1]:
                kind = "read"
            if first_in_item:
                kind = "read"
            first_in_item = False
            spans.append((m.group(1), offsets[k] + m.start(), kind))
        for m in re.finditer(r"\]\(([^)\s]+)\)", re.sub(r"`[^`\n]*`", "", line)):
            links.append((m.group(1), offsets[k]))
    return spans, links


def main(argv):
    root = "."
    if argv[:1] == ["--root"]:
        root, argv = argv[1], argv[2:]
    files = repo_files(root)
    fileset = set(files)
    dirs = {os.path.dirname(f) for f in files}
    dirs |= {d for f in dirs for d in [os.path.dirname(f)]}
    alldirs = set()
    for d in dirs:
        while d:
            alldirs.add(d)
            d = os.path.dirname(d)
    basenames = {os.path.basename(f) for f in files} | {os.path.basename(d) for d in alldirs}
    defined, arity, called, words = code_index(root, files)
    strict_ok = defined | called

    counts = {"functions": 0, "names": 0, "files": 0, "links": 0}
    missing = []

    def path_exists(path, doc):
        p = path.rstrip("/")
        for base in ("", os.path.relpath(os.path.dirname(os.path.abspath(doc)), os.path.abspath(root))):
            q = os.path.normpath(os.path.join(base, p)) if base not in ("", ".") else os.path.normpath(p)
            if q in fileset or q in alldirs:
                return True
        return "/" not in p and p in basenames

    for doc in argv:
        text = open(doc, errors="replace").read()
        spans, links = doc_spans(text)
        # the words of the doc's own command blocks: an experiment they name (exp_name) is theirs
        own_words = set(IDENT.findall("\n".join(re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M))))
        where = lambda off: "%s:%d" % (doc, text.count("\n", 0, off) + 1)
        for span, off, kind in spans:
            s = span.strip()
            if s in FOREIGN:
                continue
            # a test by its number: t_NN or tests/t_NN
            t = re.match(r"(?:tests/)?(t_\d\d)$", s)
            if t:
                counts["files"] += 1
                if not any(re.match(r"tests/%s_.*\.sh$" % t.group(1), f) for f in files):
                    missing.append("%s: test `%s`: there is no tests/%s_*.sh" % (where(off), s, t.group(1)))
                continue
            # a path: a name with a code or doc extension, or under one of the repo's folders
            top = s.split("/")[0]
            looks_path = re.match(r"[\w.-]*[\w-][\w./-]*$", s) and not s.startswith((".", "-")) and (
                s.endswith(PATH_EXT) or ("/" in s and top in alldirs))
            if looks_path and not s.startswith(WRITTEN):
                counts["files"] += 1
                if not path_exists(s, doc):
                    missing.append("%s: file `%s` is not in the repo" % (where(off), s))
                continue
            if looks_path or re.search(r"[\s]", s) and not re.match(r"[A-Za-z_]\w*\s*[(<]", s):
                continue
            # a function: name(...), name<...>, name<<<...>>>, or a read column / Read list
            m = re.match(r"([A-Za-z_]\w*)\s*(\(|<)", s)
            if m and m.group(2) == "<" and not (s.endswith(">") or re.search(r">\s*\(", s)):
                m = None  # a file name with a placeholder, log_<id>.out
            if m and m.group(2) == "(" and not closes_at_end(s, m.end() - 1):
                m = None  # not a call: TP(0)-CP(0)-..., a rank's name
            if m and not s.startswith(("struct ", "enum ")):
                name = m.group(1)
                counts["functions"] += 1
                if name in FOREIGN:
                    continue
                if name not in strict_ok:
                    missing.append("%s: function `%s` is defined nowhere in the code" % (where(off), name))
                    continue
                args = re.match(r"[A-Za-z_]\w*\s*\(([^()]*)\)$", s)
                if args and name in arity and len(arity[name]) >= 1:
                    given = [a.strip() for a in args.group(1).split(",")] if args.group(1).strip() else []
                    if given and all(re.match(r"[A-Za-z_]\w*$", a) for a in given):
                        wants = {n for n in arity[name] if n is not None}
                        if wants and len(given) not in wants:
                            missing.append("%s: `%s` gives %d arguments; the code's %s takes %s" % (
                                where(off), s, len(given), name,
                                " or ".join(str(n) for n in sorted(wants))))
                continue
            if kind == "read":
                for name in re.findall(r"[A-Za-z_]\w*", s):
                    counts["functions"] += 1
                    if name not in strict_ok and name not in FOREIGN:
                        missing.append("%s: `%s` in a read list is defined nowhere in the code" % (
                            where(off), name))
                continue
            # other names: each identifier with an underscore of a.b / a->b / name
            if re.match(r"[A-Za-z_][\w.>\-\[\]]*$", s):
                for name in re.findall(r"[A-Za-z_]\w*", s):
                    if "_" not in name.strip("_") or name in FOREIGN:
                        continue
                    counts["names"] += 1
                    if name not in words and name not in own_words:
                        missing.append("%s: name `%s` occurs nowhere in the code" % (where(off), name))
        for target, off in links:
            if re.match(r"[a-z]+:", target):
                continue
            counts["links"] += 1
            path, _, anchor = target.partition("#")
            file = os.path.join(os.path.dirname(doc), path) if path else doc
            if path and not os.path.exists(file):
                missing.append("%s: link to %s, which is not there" % (where(off), target))
            elif anchor and file.endswith(".md") and anchor not in anchors(file):
                missing.append("%s: link to %s: %s has no heading #%s" % (
                    where(off), target, path or doc, anchor))

    print("%d docs: %d functions, %d other names, %d files, %d links checked; %d missing" % (
        len(argv), counts["functions"], counts["names"], counts["files"], counts["links"],
        len(missing)))
    for line in missing:
        print("  " + line)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
