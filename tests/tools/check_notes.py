#!/usr/bin/env python3
"""Checks the repository's notes (STYLE.md): each `Note [X]` is defined exactly once, and every
other mention of a note names one that is defined somewhere.

A definition is a comment line (or docstring line) whose text starts with `Note [X]` followed by
`:` or the end of the line:

    // Note [Attention dropout]: the mask is regenerated from (seed, offset) ...
    # Note [Functional collectives]: every row returns a new tensor ...
    \"\"\"Note [Dimension cap]: tensors have at most 64 dimensions ...

Every other mention (`See Note [X]`, `(Note [X] in kiln/foo.h)`) is a reference. Scans C++,
CUDA, Python, TOML, CMake, shell and markdown files under the repository root, skipping build*/,
.venv and .git. Prints one line per problem, naming the note and the files, and exits 1 if there
is any; run by ctest (Notes.DefinedOnce).

    python3 tests/tools/check_notes.py [ROOT]
"""
import os
import re
import sys

EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".py", ".pyi", ".toml", ".cmake",
              ".txt", ".md", ".sh", ".in")
SKIP_DIRS = {".git", ".venv", "__pycache__", "node_modules"}
SELF = os.path.abspath(__file__)

MENTION = re.compile(r"Note \[([^\]\n]+)\]")
# A comment marker (C++, Python/TOML/CMake/shell, C block, markdown), or a docstring's opening
# quotes, then the note's name, an optional parenthesis without a path ("(PyTorch's)"; "Note [X]
# (kiln/foo.h): ..." is a reference) and a colon or the end of the line.
DEFINITION = re.compile(r'^\s*(?://+|#+|/?\*+|<!--|(?:[rRbBuU]?"""|\'\'\'))?\s*Note \[([^\]\n]+)\]'
                        r'(?:\s*\([^)./\n]*\))?(?::|\s*$)')


def is_script(path):
    """Extension-less files under scripts/ (bash and Python entry points)."""
    return os.path.basename(os.path.dirname(path)) == "scripts" and "." not in os.path.basename(path)


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith("build")
                             and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if path == SELF:
                continue  # its own docstring shows the syntax
            if name.endswith(EXTENSIONS) or name == "CMakeLists.txt" or is_script(path):
                yield path


def scan(root):
    """Returns ({note: [(file, line)]} of definitions, {note: [(file, line)]} of references)."""
    defs, refs = {}, {}
    for path in source_files(root):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, OSError):
            continue
        rel = os.path.relpath(path, root)
        for lineno, line in enumerate(lines, 1):
            if "Note [" not in line:
                continue
            d = DEFINITION.match(line)
            for m in MENTION.finditer(line):
                name = " ".join(m.group(1).split())
                where = (rel, lineno)
                if d and m.start() == d.start(1) - len("Note ["):
                    defs.setdefault(name, []).append(where)
                else:
                    refs.setdefault(name, []).append(where)
    return defs, refs


def problems(defs, refs):
    out = []
    for name in sorted(defs):
        if len(defs[name]) > 1:
            places = ", ".join(f"{f}:{n}" for f, n in defs[name])
            out.append(f"Note [{name}] is defined {len(defs[name])} times: {places}")
    for name in sorted(refs):
        if name not in defs:
            places = ", ".join(f"{f}:{n}" for f, n in refs[name])
            out.append(f"Note [{name}] is referenced but defined nowhere: {places}")
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    defs, refs = scan(root)
    found = problems(defs, refs)
    for p in found:
        print(p)
    print(f"{len(defs)} notes defined, {sum(len(v) for v in refs.values())} references, "
          f"{len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
