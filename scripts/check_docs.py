#!/usr/bin/env python3
"""Checks that the docs name only things that exist.

    scripts/check_docs.py [--root DIR] [FILE.md ...]
    scripts/check_docs.py --code       the sources: no retired name, no DESIGN.md

Without files it reads docs/*.md, README.md and python/README.md (docs/results/ holds dated
measurements, which quote the tree of their date, and is left out). For each file it checks:

  links      a Markdown link [text](target) to a local file resolves (from the file's folder);
  headers    moe/....hpp|.cuh and moe_tools/....hpp exist under include/ or tools/include/;
  paths      a path that starts with a top-level folder (include/, tools/, tests/, examples/,
             benchmarks/, scripts/, docs/, cmake/, python/) exists; <x>, * and {a,b} are globs;
  short      a shorter path to a source (`kernels/batch_split.cuh`, `smpi/smpi_layer.cpp`: one or
             more folders, then a .hpp, .cuh, .cpp, .cu or .cmake file) ends some file's path;
  files      a bare file name in code (`plan_options.hpp`, `DESIGN.md`) is a file of the repository;
  targets    moe::<name> that is not a C++ name is a CMake target the project defines;
  C++ names  moe::a::b::Name: every part is an identifier declared in the library's code
             (include/, tools/include/, tests/support/, with comments and strings removed);
  flags      a --flag given to moe_plan (in a command after `moe_plan`, or in a code span of a
             line about moe_plan) is one moe_plan reads; a bare `--flag` span in
             docs/planners.md or docs/engines.md is one some tool reads;
  retired    the names of RETIRED (CudaLayer, FinDepCudaP2PExecutor, executor_of, ...) appear nowhere.

Each problem is printed as FILE:LINE: what; the exit status is 1 if there is any, else 0 and the
line "check_docs: ok (N files)".
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys

TOP_FOLDERS = ("include", "tools", "tests", "examples", "benchmarks", "scripts", "docs", "cmake", "python")
RETIRED = ("CudaLayer", "DisaggregatedLayer", "PipelineSchedule", "FinDepCudaP2PExecutor", "findep_cuda_p2p",
           "findep_cuda_common", "executor_of", "PlannerThread")
CODE_DIRS = ("include", "tools/include", "tests/support")


def strip_comments_and_strings(code: str) -> str:
    """C++ source without comments, string and character literals (their words are not declarations)."""
    out = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == 'R' and code.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', code[i:])
            if m:
                end = code.find(")" + m.group(1) + '"', i)
                i = n if end < 0 else end + len(m.group(1)) + 2
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and code[j] != c:
                j += 2 if code[j] == "\\" else 1
            out.append(" ")
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Repo:
    def __init__(self, root: str):
        self.root = root
        try:
            files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                                   capture_output=True, text=True, check=True).stdout.split("\n")
            self.files = {f for f in files if f and os.path.exists(os.path.join(root, f))}
        except (OSError, subprocess.CalledProcessError):
            self.files = set()
            for d, _, fs in os.walk(root):
                top = os.path.relpath(d, root).split(os.sep)[0]
                if top.startswith((".git", "build")):
                    continue
                for f in fs:
                    self.files.add(os.path.relpath(os.path.join(d, f), root))
        self.basenames = {os.path.basename(f) for f in self.files}
        self.identifiers = set()
        for f in self.files:
            if f.startswith(CODE_DIRS) and f.endswith((".hpp", ".cuh", ".h")):
                with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                    self.identifiers.update(re.findall(r"[A-Za-z_]\w*", strip_comments_and_strings(fh.read())))
        self.cmake_targets = set()
        self.programs = set()  # executables the build makes: build/<folder>/<program> is not a source path
        for f in self.files:
            if f.endswith(("CMakeLists.txt", ".cmake", ".cmake.in")):
                with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                self.cmake_targets.update(re.findall(r"add_library\(\s*moe::(\w+)", text))
                self.programs.update(re.findall(r"add_executable\(\s*(\w+)", text))
                self.programs.update(re.findall(r"moe_add_(?:test|benchmark)\(\s*NAME\s+(\w+)", text))
        self.plan_flags = set(self._moe_plan_flags())
        self.tool_flags = set(self.plan_flags)
        for f in self.files:
            if f.startswith("tools/") and f.endswith((".cpp", ".cu", ".hpp")):
                with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
                    self.tool_flags.update(re.findall(r'\{"([a-z][a-z0-9-]*)"(?:, true)?\}', fh.read()))
        self.tool_flags.update({"help", "list"})

    def _moe_plan_flags(self):
        path = os.path.join(self.root, "tools/include/moe_tools/plan_options.hpp")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        m = re.search(r"kOptionNames\[\]\s*=\s*\{(.*?)\};", text, re.S)
        if not m:
            sys.exit("check_docs: cannot find moe_plan's option names (kOptionNames) in " + path)
        return re.findall(r'"([a-z][a-z0-9-]*)"', m.group(1)) + ["help"]

    def exists(self, rel: str) -> bool:
        rel = os.path.normpath(rel)
        if rel in self.files:
            return True
        prefix = rel.rstrip("/") + "/"
        return any(f.startswith(prefix) for f in self.files)

    def ends_a_path(self, tail: str) -> bool:
        return any(f == tail or f.endswith("/" + tail) for f in self.files)

    def glob_exists(self, pattern: str) -> bool:
        if not re.search(r"[*?\[]", pattern):
            return self.exists(pattern)
        return bool(glob.glob(os.path.join(self.root, pattern))) or any(
            re.fullmatch(glob_to_regex(pattern), f) for f in self.files)


def glob_to_regex(pattern: str) -> str:
    out = []
    for c in pattern:
        out.append(".*" if c == "*" else "." if c == "?" else re.escape(c))
    return "".join(out) + "(/.*)?"


def code_regions(lines):
    """(line number, text, in_fence) for each line; the text of prose lines is kept whole."""
    fence = False
    for no, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        yield no, line, fence


def spans(line: str):
    return re.findall(r"`([^`]+)`", line)


def generalise(path: str) -> str:
    """A doc path with its placeholders as glob stars: <r>, {a,b}, ..., N."""
    path = re.sub(r"<[^>]*>", "*", path)
    path = re.sub(r"\{[^}]*\}", "*", path)
    path = path.replace("...", "*")
    return path


def check_file(repo: Repo, rel: str, problems: list):
    path = os.path.join(repo.root, rel)
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    here = os.path.dirname(rel)
    is_flag_doc = rel in ("docs/planners.md", "docs/engines.md")
    carry = ""
    for no, line, fence in code_regions(lines):
        say = lambda what: problems.append(f"{rel}:{no}: {what}")  # noqa: E731
        code_parts = [line] if fence else spans(line)

        # links
        if not fence:
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue
                t = target.split("#")[0]
                if t and not repo.exists(os.path.join(here, t)):
                    say(f"link to '{target}', which does not exist")

        for part in code_parts:
            # headers
            for h in re.findall(r"(?<![\w/.-])((?:moe|moe_tools)/[\w/.-]+?\.(?:hpp|cuh|h))\b", part):
                if not (repo.exists("include/" + h) or repo.exists("tools/include/" + h)):
                    say(f"header '{h}' does not exist")
            # repository paths
            for p in re.findall(r"(?<![\w/.~$-])((?:%s)/[\w./<>*{},+-]*)" % "|".join(TOP_FOLDERS), part):
                p = p.rstrip(".,:;)")
                if p.startswith("include/moe/") is False and p.startswith("python/build"):
                    continue
                if repo.glob_exists(generalise(p)):
                    continue
                folder, program = os.path.split(p)
                if program in repo.programs and repo.exists(folder):
                    continue  # a program built from that folder (build/tools/planner/moe_plan)
                say(f"path '{p}' does not exist")
        for part in code_parts:
            # shorter paths to sources: the tail of some file's path (engines' files are .py, not
            # checked here)
            for p in re.findall(r"(?<![\w/.~$<*{-])((?:[\w.-]+/)+[\w-]+\.(?:hpp|cuh|cpp|cu|cmake))\b(?![/\w])", part):
                top = p.split("/")[0]
                if top in TOP_FOLDERS + ("moe", "moe_tools") or top.startswith("build"):
                    continue  # checked above as headers and paths; build folders hold no sources
                if not repo.ends_a_path(p):
                    say(f"no file's path ends in '{p}'")
        for part in [line]:
            # bare file names, in code and prose
            # (sources of this project, and upper-case Markdown names such as DESIGN.md; other .py and
            # .md names are often the engines' files or a program's output)
            for name in re.findall(r"(?<![\w/.<*-])([A-Za-z_][\w-]*\.(?:hpp|cuh|cpp|cu|cmake)|[A-Z][A-Z_]+\.md)\b(?![/\w])", part):
                if name not in repo.basenames:
                    say(f"file '{name}' is not in the repository")
        for part in code_parts:
            # moe:: names
            for q in re.findall(r"(?<![\w:])moe::(?:[A-Za-z_]\w*::)*[A-Za-z_]\w*", part):
                parts = q.split("::")[1:]
                if len(parts) == 1 and parts[0] in repo.cmake_targets:
                    continue
                missing = [p for p in parts if p not in repo.identifiers]
                if missing:
                    kind = "CMake target or C++ name" if len(parts) == 1 else "C++ name"
                    say(f"{kind} '{q}' does not exist ({', '.join(missing)} declared nowhere)")

        # moe_plan flags in commands (fenced, continuations joined) and in code spans
        if fence:
            carry += line.rstrip("\\") + " "
            if line.rstrip().endswith("\\"):
                continue
            commands = [(no, carry)]
            carry = ""
        else:
            commands = [(no, s) for s in spans(line)] if "moe_plan" in line else []
        for cno, text in commands:
            for cmd in re.split(r"&&|\|\||;|\|", text):
                m = re.search(r"(?:^|[\s/])moe_plan\b(.*)", cmd)
                if not m:
                    continue
                for flag in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", m.group(1)):
                    if flag not in repo.plan_flags:
                        problems.append(f"{rel}:{cno}: moe_plan has no option --{flag}")
        if is_flag_doc and not fence:
            for s in spans(line):
                m = re.fullmatch(r"--([a-z][a-z0-9-]*)(?:[ =].*)?", s)
                if m and m.group(1) not in repo.tool_flags:
                    say(f"no tool reads the option --{m.group(1)}")
        # retired names
        for old in RETIRED:
            if re.search(r"\b%s\b" % old, line):
                say(f"'{old}' is a retired name")


def check_code(repo: Repo) -> int:
    """The names a redesign retired, and the design file the repository does not have, in code."""
    problems = []
    names = RETIRED + (() if "DESIGN.md" in repo.basenames else ("DESIGN.md",))
    pattern = re.compile(r"\b(%s)\b" % "|".join(re.escape(n) for n in names))
    for f in sorted(repo.files):
        if f.startswith(("docs/results/", "tests/scripts/data/")) or f == "scripts/check_docs.py" or f.endswith(".md"):
            # the dated results quote their day's tree; the planted page and the checker name them on purpose
            continue
        if not f.endswith((".hpp", ".cuh", ".cpp", ".cu", ".py", ".sh", ".txt", ".cmake", ".in", ".toml")):
            continue
        with open(os.path.join(repo.root, f), encoding="utf-8", errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                for m in pattern.finditer(line):
                    problems.append(f"{f}:{no}: '{m.group(1)}' names something that does not exist")
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in the sources")
        return 1
    print(f"check_docs: ok (sources: no retired name)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("files", nargs="*", help="Markdown files relative to the root (default: the docs)")
    ap.add_argument("--expect", metavar="FILE",
                    help="pass when the problems found are exactly FILE's lines (a planted page's test)")
    ap.add_argument("--code", action="store_true",
                    help="check the sources (code, scripts, CMake) for retired names and DESIGN.md instead")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    repo = Repo(root)
    if a.code:
        return check_code(repo)
    files = a.files or sorted(glob.glob("docs/*.md", root_dir=root)) + ["README.md", "python/README.md"]
    problems: list[str] = []
    for f in files:
        rel = os.path.relpath(os.path.abspath(os.path.join(root, f)) if not os.path.isabs(f) else f, root)
        if not os.path.exists(os.path.join(root, rel)):
            problems.append(f"{rel}: no such file")
            continue
        check_file(repo, rel, problems)
    problems = list(dict.fromkeys(problems))
    for p in problems:
        print(p)
    if a.expect:
        with open(os.path.join(root, a.expect), encoding="utf-8") as fh:
            expected = [l for l in fh.read().split("\n") if l]
        missed = [e for e in expected if e not in problems]
        extra = [p for p in problems if p not in expected]
        for e in missed:
            print("check_docs: not reported: " + e)
        for p in extra:
            print("check_docs: not expected: " + p)
        ok = not missed and not extra
        print(f"check_docs: {'ok, ' if ok else ''}{len(problems) - len(extra)} of {len(expected)} expected problems reported")
        return 0 if ok else 1
    if problems:
        print(f"check_docs: {len(problems)} problem(s) in {len(files)} files")
        return 1
    print(f"check_docs: ok ({len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
