#!/usr/bin/env python3
"""Check the client library's man pages against what it exports and what the build installs.

Fails when:
  - a function exported by libgpumem_client (its version script and, when nm is given, the built library)
    is not named in the NAME section of exactly one page, or that page's SYNOPSIS lacks its prototype;
  - an exported function has no installed alias (man3/FUNCTION.3) pointing at that page, or an alias names
    a function that is not exported or a page that is not built;
  - a prototype in a SYNOPSIS differs from the declaration in gpumem-client.h (whitespace and comments
    aside), or a SYNOPSIS holds something other than #include lines and prototypes;
  - a struct typedef shown in a page differs from the header's (comments and whitespace aside), or a struct
    of the header is shown on no page;
  - a page names a path of the source tree (docs/..., libclient/..., a bare *.md) instead of the installed
    documentation, or an installed document (/usr/share/doc/gpumemd/X) that the build does not install;
  - a page source is not built, or a built page has no source; a document in docs/ is not installed.
"""
import argparse
import os
import re
import subprocess
import sys

DOC_PREFIX = "/usr/share/doc/gpumemd/"
# top-level directories of the source tree, as a page might name them
TREE_DIRS = ("docs", "libclient", "daemon", "thunk", "tests", "scripts", "proto", "util", "systemd", "python")


def strip_c_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def norm(stmt):
    """One C declaration, comments gone, whitespace collapsed and dropped next to punctuation."""
    s = " ".join(strip_c_comments(stmt).split())
    s = re.sub(r"\s*([(),*;{}\[\]])\s*", r"\1", s)
    return s.strip()


def top_level_statements(text, with_lines=False):
    """The ';'-terminated statements of C text at brace depth 0 (a struct's body stays in its statement),
    with the number of the line each begins on (from 0) when asked."""
    out, cur, depth, line, first = [], [], 0, 0, None
    for ch in text:
        if first is None and not ch.isspace():
            first = line
        cur.append(ch)
        if ch == "\n":
            line += 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == ";" and depth == 0:
            s = "".join(cur).strip()
            if s:
                out.append((first, s))
            cur, first = [], None
    rest = "".join(cur).strip()
    if rest:
        out.append((first, rest))
    return out if with_lines else [s for _, s in out]


def func_name(decl):
    m = re.match(r"[^(]*?(\w+)\s*\(", decl, re.S)
    return m.group(1) if m else None


def struct_name(decl):
    m = re.match(r"typedef\s+struct\s+\w*\s*\{.*\}\s*(\w+)\s*;?$", decl, re.S)
    return m.group(1) if m else None


def parse_header(path):
    text = open(path, encoding="utf-8").read()
    # the C++ guards hold only extern "C" { and its }
    text = re.sub(r"#ifdef __cplusplus.*?#endif", " ", text, flags=re.S)
    text = strip_c_comments(text)
    text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("#"))
    funcs, structs = {}, {}
    for st in top_level_statements(text):
        if st.startswith("typedef struct"):
            name = struct_name(st)
            if name:
                structs[name] = norm(st)
        elif "(" in st and not st.startswith(("typedef", "enum")):
            name = func_name(st)
            if name:
                funcs[name] = norm(st)
    return funcs, structs


def parse_sym(path):
    names = set()
    for line in open(path, encoding="utf-8"):
        line = strip_c_comments(line).strip()
        m = re.fullmatch(r"(\w+);", line)
        if m:
            names.add(m.group(1))
    return names


def library_symbols(nm, lib):
    out = subprocess.run([nm, "-D", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] == "A":  # A: the version nodes themselves
            continue
        names.add(parts[2].split("@")[0])
    return names


def unescape_scdoc(s):
    return re.sub(r"\\(.)", r"\1", s)


class Page:
    def __init__(self, path):
        self.path = path
        self.file = os.path.basename(path)
        self.name = self.file[: -len(".scd")]
        self.lines = open(path, encoding="utf-8").read().split("\n")
        self.sections = {}  # "NAME" -> [(line number, text)]
        self.code_blocks = []  # (section, first line number, text)
        sec, in_code, block, start = None, False, [], 0
        for i, line in enumerate(self.lines, 1):
            if in_code:
                if line.startswith("```"):
                    self.code_blocks.append((sec, start, unescape_scdoc("\n".join(block))))
                    in_code, block = False, []
                else:
                    block.append(line)
                continue
            if line.startswith("```"):
                in_code, start = True, i + 1
                continue
            if line.startswith(";"):  # an scdoc comment: not in the page
                continue
            m = re.match(r"# (.+)$", line)
            if m:
                sec = m.group(1).strip()
                self.sections.setdefault(sec, [])
                continue
            if sec:
                self.sections[sec].append((i, line))

    def name_functions(self):
        text = " ".join(l for _, l in self.sections.get("NAME", []))
        names = text.split(" - ", 1)[0] if " - " in text else ""
        return [n.strip() for n in names.split(",") if n.strip()]

    def synopsis(self):
        """[(line, statement)] of the SYNOPSIS's code: prototypes, and anything else for the caller to refuse."""
        out = []
        for sec, start, text in self.code_blocks:
            if sec != "SYNOPSIS":
                continue
            # lines kept in place (blanked), so that each statement's line number stays true
            text = "\n".join("" if l.lstrip().startswith("#include") else l for l in text.split("\n"))
            text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
            for off, st in top_level_statements(text, with_lines=True):
                out.append((start + off, st))
        return out

    def text_lines(self):
        """Every line of the page's source that the page shows."""
        for i, line in enumerate(self.lines, 1):
            if not line.startswith(";"):
                yield i, line


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--header", required=True)
    ap.add_argument("--sym", required=True, help="the library's version script")
    ap.add_argument("--library", help="the built library, read with --nm")
    ap.add_argument("--nm")
    ap.add_argument("--man-dir", required=True)
    ap.add_argument("--aliases-file", required=True, help="FUNCTION PAGE per line, as the build reads it")
    ap.add_argument("--docs-dir", help="docs/: every *.md in it must be installed (--doc)")
    ap.add_argument("--page", action="append", default=[], help="a page the build makes (NAME.SECTION)")
    ap.add_argument("--alias", action="append", default=[], help="FUNCTION=PAGE, an alias the build installs")
    ap.add_argument("--doc", action="append", default=[], help="a document installed under share/doc/gpumemd")
    a = ap.parse_args()

    errors = []

    def fail(msg):
        errors.append(msg)

    # ---- what is exported
    exported = parse_sym(a.sym)
    if not exported:
        fail(f"{a.sym}: no exported symbol found")
    sources = [os.path.basename(a.sym)]
    if a.nm and a.library:
        if os.path.exists(a.library):
            built = library_symbols(a.nm, a.library)
            for s in sorted(built - exported):
                print(f"note: {s} is exported by {os.path.basename(a.library)} but not in {os.path.basename(a.sym)}")
            for s in sorted(exported - built):
                print(f"note: {s} is in {os.path.basename(a.sym)} but not exported by {os.path.basename(a.library)}")
            exported |= built
            sources.append(os.path.basename(a.library))
        else:
            fail(f"{a.library}: no such file")
    else:
        print("note: no nm or library given: the exported symbols are the version script's only")

    header_funcs, header_structs = parse_header(a.header)

    # ---- the pages
    pages = {}
    for f in sorted(os.listdir(a.man_dir)):
        if f.endswith(".scd"):
            p = Page(os.path.join(a.man_dir, f))
            pages[p.name] = p
    built_pages = set(a.page)
    for name in sorted(set(pages) - built_pages):
        fail(f"{name}.scd: the build does not make this page (docs/meson.build's list)")
    for name in sorted(built_pages - set(pages)):
        fail(f"{name}: the build makes this page but {name}.scd does not exist")

    n_protos = n_structs = 0
    shown_structs = set()
    named_in = {}  # function -> pages whose NAME lists it
    proto_in = {}  # function -> pages whose SYNOPSIS gives its prototype
    for p in pages.values():
        if "NAME" not in p.sections:
            fail(f"{p.file}: no NAME section")
        if "SYNOPSIS" not in p.sections:
            fail(f"{p.file}: no SYNOPSIS section")
        for fn in p.name_functions():
            if fn.startswith("gm_"):
                named_in.setdefault(fn, []).append(p.name)
        for line, st in p.synopsis():
            fn = func_name(st) if "(" in st else None
            if not fn:
                fail(f"{p.file}:{line}: SYNOPSIS holds something that is no prototype: {' '.join(st.split())}")
                continue
            proto_in.setdefault(fn, []).append(p.name)
            n_protos += 1
            want = header_funcs.get(fn)
            if want is None:
                fail(f"{p.file}:{line}: SYNOPSIS declares {fn}(), which gpumem-client.h does not")
            elif norm(st) != want:
                fail(f"{p.file}:{line}: the prototype of {fn}() differs from gpumem-client.h:\n"
                     f"    page:   {norm(st)}\n    header: {want}")
            if fn not in exported:
                fail(f"{p.file}:{line}: SYNOPSIS declares {fn}(), which the library does not export")
            if fn not in p.name_functions():
                fail(f"{p.file}:{line}: {fn}() is in the SYNOPSIS but not in the NAME section")
        for sec, line, text in p.code_blocks:
            for st in top_level_statements(strip_c_comments(text)):
                if not st.startswith("typedef struct"):
                    continue
                name = struct_name(st)
                if name is None:
                    continue
                want = header_structs.get(name)
                n_structs += 1
                shown_structs.add(name)
                if want is None:
                    fail(f"{p.file}:{line}: shows struct {name}, which gpumem-client.h does not define")
                elif norm(st) != want:
                    fail(f"{p.file}:{line}: struct {name} differs from gpumem-client.h:\n"
                         f"    page:   {norm(st)}\n    header: {want}")

    for name in sorted(set(header_structs) - shown_structs):
        fail(f"struct {name} of gpumem-client.h is shown on no page")
    for fn in sorted(set(named_in) - exported):
        fail(f"{', '.join(named_in[fn])}: NAME lists {fn}, which the library does not export")

    # ---- aliases: the build's list, and the file it reads
    build_alias = {}
    for spec in a.alias:
        fn, _, page = spec.partition("=")
        if fn in build_alias:
            fail(f"the build installs the alias {fn}.3 twice")
        build_alias[fn] = page
    file_alias = {}
    for n, line in enumerate(open(a.aliases_file, encoding="utf-8"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if len(words) != 2:
            fail(f"{a.aliases_file}:{n}: not FUNCTION PAGE: {line}")
            continue
        if words[0] in file_alias:
            fail(f"{a.aliases_file}:{n}: {words[0]} is listed twice")
        file_alias[words[0]] = words[1]
    if file_alias != build_alias:
        fail(f"the aliases the build installs differ from {os.path.basename(a.aliases_file)}")

    for fn in sorted(exported):
        names = named_in.get(fn, [])
        if not names:
            fail(f"{fn}: exported, but no page names it in its NAME section")
            continue
        if len(names) > 1:
            fail(f"{fn}: named by more than one page: {', '.join(names)}")
        page = names[0]
        if page not in proto_in.get(fn, []):
            fail(f"{fn}: {page}.scd names it but its SYNOPSIS has no prototype of it")
        alias = build_alias.get(fn)
        if alias is None:
            fail(f"{fn}: no man page alias is installed for it (man3/{fn}.3)")
        elif alias != page:
            fail(f"{fn}: its alias points at {alias}, but {page} documents it")
        elif not alias.endswith(".3"):
            fail(f"{fn}: its alias points at {alias}, which is not a section 3 page")
    for fn, page in sorted(build_alias.items()):
        if fn not in exported:
            fail(f"alias {fn}.3 -> {page}: {fn} is not exported")
        if page not in built_pages:
            fail(f"alias {fn}.3 -> {page}: the build makes no page {page}")

    # ---- paths: the installed documentation, never the source tree
    installed_docs = set(a.doc)
    tree = re.compile(r"(?<![A-Za-z0-9/.-])(?:\.\./|(?:%s)/)" % "|".join(TREE_DIRS))
    # scdoc's _underline_ and *bold* marks around a path are no part of it
    md = re.compile(r"[A-Za-z0-9./-]*\.md(?![A-Za-z0-9])")
    docref = re.compile(re.escape(DOC_PREFIX) + r"([A-Za-z0-9.-]*[A-Za-z0-9])")
    for p in pages.values():
        for i, line in p.text_lines():
            m = tree.search(line)
            if m:
                fail(f"{p.file}:{i}: names a path of the source tree ({line.strip()[:80]}); "
                     f"refer to the installed documentation under {DOC_PREFIX}")
            for m in md.finditer(line):
                if not m.group(0).startswith(DOC_PREFIX):
                    fail(f"{p.file}:{i}: names {m.group(0)} outside {DOC_PREFIX}")
            for m in docref.finditer(line):
                if installed_docs and m.group(1) not in installed_docs:
                    fail(f"{p.file}:{i}: names {DOC_PREFIX}{m.group(1)}, which the build does not install")
    if a.docs_dir:
        for f in sorted(os.listdir(a.docs_dir)):
            if f.endswith(".md") and f not in installed_docs:
                fail(f"docs/{f} is not installed (docs/meson.build's doc_files)")

    if errors:
        for e in errors:
            print("FAIL: " + e)
        print(f"{len(errors)} problem(s) in the man pages")
        return 1
    print(f"{len(exported)} exported functions ({' + '.join(sources)}), each on its page with its prototype "
          f"and an alias; {n_protos} prototypes and {n_structs} structs match the header; {len(pages)} pages, "
          f"{len(installed_docs)} documents installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
