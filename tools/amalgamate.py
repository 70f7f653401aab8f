#!/usr/bin/env python3
"""tools/amalgamate.py: generate the single headers single_include/pss/pss.hpp (from include/pss/pss.hpp)
and single_include/pss/keras.hpp (from include/pss/keras.hpp: `#include "pss.hpp"`, then what pss.hpp
does not hold already).

Every `#include <pss/...>` is replaced, at its first occurrence, by the text of that header
(recursively, resolved by path under include/); later occurrences are dropped. Other includes are
left alone. Each inlined header's `#pragma once` is dropped and one stands at the top. The output is
deterministic (no dates, no absolute paths) and starts with a DO-NOT-EDIT banner.

    python3 tools/amalgamate.py            write single_include/pss/pss.hpp and keras.hpp
    python3 tools/amalgamate.py --check    exit 1 if a file on disk is not what would be written
    python3 tools/amalgamate.py --stdout   print the result instead of writing it

Standard library only.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

# Each single header: its root under include/, and what it says it is. A later one includes the earlier
# ones (`#include "pss.hpp"`, beside it) instead of repeating what they hold.
SINGLE_HEADERS = [
    ("pss/pss.hpp", "the library without its Keras-style layer"),
    ("pss/keras.hpp", "the Keras-style layer; it includes pss.hpp, beside it"),
]

PSS_INCLUDE = re.compile(r'^\s*#\s*include\s*<(pss/[^>]+)>\s*(//.*|/\*.*\*/\s*)?$')
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
PRAGMA_ONCE = re.compile(r'^\s*#\s*pragma\s+once\b')
CONDITIONAL_OPEN = re.compile(r'^\s*#\s*(if|ifdef|ifndef)\b')
CONDITIONAL_CLOSE = re.compile(r'^\s*#\s*endif\b')
VERSION = re.compile(r'^#define PSS_VERSION_(MAJOR|MINOR|PATCH) (\d+)\s*$', re.M)


class AmalgamationError(Exception):
    pass


class Amalgamator:
    def __init__(self, include_dir: Path, earlier: dict[str, set[str]] | None = None) -> None:
        self.include_dir = include_dir
        self.done: set[str] = set()
        self.stack: list[str] = []
        # Roots of single headers written before this one, with the headers each holds: an include of
        # such a root becomes an include of its single header.
        self.earlier = earlier or {}

    def header(self, name: str, where: str) -> list[str]:
        """The lines of <name>, its own pss includes inlined; [] if it was inlined already."""
        if name in self.done:
            return []
        if name in self.earlier:
            self.done |= self.earlier[name] | {name}
            return [f'#include "{Path(name).name}"', ""]
        if name in self.stack:
            cycle = " -> ".join(self.stack + [name])
            raise AmalgamationError(f"include cycle: {cycle}")
        path = self.include_dir / name
        if not path.is_file():
            raise AmalgamationError(f"{where}: includes <{name}>, but {path} does not exist")
        self.stack.append(name)
        text = path.read_text(encoding="utf-8")
        out: list[str] = []
        depth = 0  # preprocessor conditional nesting: a pss include inside one cannot be inlined once
        removed = False  # a directive was just dropped: blank lines after it collapse into one
        for number, line in enumerate(text.splitlines(), start=1):
            here = f"include/{name}:{number}"
            if not line.strip():
                if removed and (not out or not out[-1]):
                    continue
            else:
                removed = False
            if PRAGMA_ONCE.match(line):
                removed = True
                continue
            if CONDITIONAL_OPEN.match(line):
                depth += 1
            elif CONDITIONAL_CLOSE.match(line):
                depth -= 1
            quoted = QUOTED_INCLUDE.match(line)
            if quoted:
                raise AmalgamationError(
                    f"{here}: #include \"{quoted.group(1)}\": pss headers include with angle brackets, by path "
                    "under include/")
            match = PSS_INCLUDE.match(line)
            if match:
                if depth > 0:
                    raise AmalgamationError(
                        f"{here}: #include <{match.group(1)}> inside #if/#ifdef cannot be amalgamated; "
                        "include it unconditionally")
                out.extend(self.header(match.group(1), here))
                removed = True
                continue
            if line.lstrip().startswith("#include") and "<pss/" in line:
                raise AmalgamationError(f"{here}: cannot parse this pss include: {line.strip()}")
            out.append(line.rstrip())
        self.stack.pop()
        self.done.add(name)
        # Strip blank lines at either end so files join with exactly one blank line between them.
        while out and not out[0]:
            out.pop(0)
        while out and not out[-1]:
            out.pop()
        return out + [""] if out else []


def version(include_dir: Path) -> str:
    text = (include_dir / "pss" / "version.hpp").read_text(encoding="utf-8")
    parts = dict(VERSION.findall(text))
    try:
        return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    except KeyError as missing:
        raise AmalgamationError(f"include/pss/version.hpp defines no PSS_VERSION_{missing.args[0]}") from None


def amalgamate(root: Path) -> dict[Path, str]:
    """Each single header's path (under root) and text."""
    include_dir = root / "include"
    out: dict[Path, str] = {}
    earlier: dict[str, set[str]] = {}
    for root_header, what in SINGLE_HEADERS:
        amalgamator = Amalgamator(include_dir, dict(earlier))
        body = amalgamator.header(root_header, "tools/amalgamate.py")
        inlined = sorted(amalgamator.done - {root_header} - {h for e in earlier.values() for h in e} - set(earlier))
        banner = [
            f"// {root_header}: pss {version(include_dir)} as a single header: {what}.",
            "//",
            f"// GENERATED by tools/amalgamate.py from include/{root_header}. DO NOT EDIT: edit the headers",
            "// under include/ and run `python3 tools/amalgamate.py`; a test fails while this file is stale.",
            f"// Inlined headers ({len(inlined)}): " + ", ".join(inlined),
            "#pragma once",
            "",
        ]
        # Wrap the long list of inlined headers at 110 columns, as comments.
        wrapped: list[str] = []
        line = ""
        for word in banner[4].split(" "):
            if line and len(line) + 1 + len(word) > 110:
                wrapped.append(line)
                line = "//   " + word
            else:
                line = f"{line} {word}" if line else word
        wrapped.append(line)
        banner[4:5] = wrapped
        out[Path("single_include") / root_header] = "\n".join(banner + body).rstrip("\n") + "\n"
        earlier[root_header] = amalgamator.done - {root_header}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file on disk is stale")
    parser.add_argument("--stdout", action="store_true", help="print instead of writing")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: this script's parent's parent)")
    args = parser.parse_args(argv)

    try:
        outputs = amalgamate(args.root)
    except (AmalgamationError, OSError) as error:
        print(f"amalgamate.py: error: {error}", file=sys.stderr)
        return 2

    status = 0
    for output, text in outputs.items():
        status = max(status, write_or_check(args, args.root / output, output, text))
    return status


def write_or_check(args: argparse.Namespace, path: Path, output: Path, text: str) -> int:
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            print(f"{output} is current")
            return 0
        if current is None:
            print(f"{output} does not exist: run `python3 tools/amalgamate.py`", file=sys.stderr)
            return 1
        diff = difflib.unified_diff(current.splitlines(), text.splitlines(),
                                    f"{output} (on disk)", f"{output} (from include/)", lineterm="", n=1)
        shown = list(diff)
        print(f"{output} is stale: run `python3 tools/amalgamate.py` and commit the result", file=sys.stderr)
        print("\n".join(shown[:60]), file=sys.stderr)
        if len(shown) > 60:
            print(f"... ({len(shown) - 60} more diff lines)", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        print(f"{output} is already current")
        return 0
    with open(path, "w", encoding="utf-8", newline="\n") as stream:
        stream.write(text)
    print(f"wrote {output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
