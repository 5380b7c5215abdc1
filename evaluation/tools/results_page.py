"""Refresh the generated tables of docs/results.md, or check that they are current.

    python -m evaluation.tools.results_page            # rewrite every generated block from its file
    python -m evaluation.tools.results_page --check    # exit 1, one line per problem; writes nothing

A generated block is the text between two marker lines:

    <!-- begin PATH -->
    ...
    <!-- end PATH -->

PATH is relative to the repository root. A Markdown file is copied whole; `PATH#Heading` copies the text under
that heading of the file, down to its next heading (the heading line itself is left out). A CSV file is rendered
as a Markdown table, its cells as written. The page is written whole to a temporary file, then renamed over
the old one, and only when something changed.

The check also reads the page's sections: every `## ` or `### ` section with a table in it, in its own text or
in a generated block, needs a line `Regenerate: `command`` before its first table, naming the command that
makes the table (`make ...`, `python ...`, `bash ...`).

Standard library only, and nothing from the project: it runs wherever the page is edited.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = Path("docs/results.md")

BEGIN = re.compile(r"^<!-- begin (?P<source>\S.*?) -->\s*$")
END = re.compile(r"^<!-- end (?P<source>\S.*?) -->\s*$")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
REGENERATE = re.compile(r"^Regenerate:\s*`(?P<command>[^`]+)`")
COMMAND = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S+\s+)*(?:make|python3?|\.venv/bin/python|bash)(?:\s|$)")


class PageError(Exception):
    """A problem that stops the page from being refreshed: a missing file or heading, an unclosed block."""


@dataclass
class Block:
    source: str   # PATH or PATH#Heading, as written in the markers
    start: int    # index of the begin marker's line
    end: int      # index of the end marker's line
    text: str     # what lies between the markers now


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def render_csv(text: str) -> str:
    """A CSV file as a Markdown table: the first row is the header; numeric columns are right-aligned."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if not rows:
        return ""
    width = max(len(row) for row in rows)
    rows = [[cell.strip().replace("|", "\\|") for cell in row] + [""] * (width - len(row)) for row in rows]
    header, body = rows[0], rows[1:]
    rule = []
    for column in range(width):
        cells = [row[column] for row in body if row[column]]
        rule.append("--:" if cells and all(_is_number(cell) for cell in cells) else ":--")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def _headings(lines: list[str]):
    """(index, level, text) of every Markdown heading outside fenced code."""
    fenced = False
    for index, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            yield index, len(match["hashes"]), match["text"]


def markdown_section(text: str, heading: str, where: str) -> str:
    """The text under the first heading whose text is `heading`, down to the next heading of any level."""
    lines = text.splitlines()
    found = list(_headings(lines))
    for number, (index, _, title) in enumerate(found):
        if title == heading:
            stop = found[number + 1][0] if number + 1 < len(found) else len(lines)
            return "\n".join(lines[index + 1:stop])
    raise PageError(f"{where}: no heading '{heading}' in it")


def render_source(source: str, root: Path) -> str:
    """What a block of `source` should hold, without the blank lines around it."""
    path, _, heading = source.partition("#")
    file = root / path
    if not file.is_file():
        raise PageError(f"{path}: file not found")
    text = file.read_text(encoding="utf-8")
    if file.suffix.lower() == ".csv":
        if heading:
            raise PageError(f"{source}: a CSV file has no headings")
        body = render_csv(text)
    elif file.suffix.lower() == ".md":
        body = markdown_section(text, heading, path) if heading else text
    else:
        raise PageError(f"{path}: only .md and .csv files can be embedded")
    return body.strip("\n")


def block_text(body: str) -> str:
    """The lines between the markers: the content with one blank line on either side."""
    return f"\n{body}\n\n" if body else "\n"


def find_blocks(lines: list[str], page: str) -> list[Block]:
    blocks, open_at, source = [], None, None
    for index, line in enumerate(lines):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if open_at is not None:
                raise PageError(f"{page}:{index + 1}: block '{begin['source']}' begins inside block '{source}'")
            open_at, source = index, begin["source"]
        elif end:
            if open_at is None or end["source"] != source:
                raise PageError(f"{page}:{index + 1}: end of '{end['source']}' without its begin marker")
            text = "".join(part + "\n" for part in lines[open_at + 1:index])
            blocks.append(Block(source, open_at, index, text))
            open_at, source = None, None
    if open_at is not None:
        raise PageError(f"{page}:{open_at + 1}: block '{source}' has no end marker")
    return blocks


def missing_regenerate(lines: list[str], blocks: list[Block], page: str) -> list[str]:
    """One line per `## `/`### ` section with a table but no Regenerate line naming a command before it."""
    inside = set()
    for block in blocks:
        inside.update(range(block.start, block.end + 1))
    problems = []
    section = None   # [line number, title, has a Regenerate line, reported]
    fenced = False
    for index, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = HEADING.match(line) if index not in inside else None
        if heading:
            level = len(heading["hashes"])
            if level <= 3:
                section = [index + 1, heading["text"], False, False] if level >= 2 else None
            continue
        if section is None:
            continue
        regenerate = REGENERATE.match(line) if index not in inside else None
        if regenerate and COMMAND.match(regenerate["command"].strip()):
            section[2] = True
        is_table = (line.lstrip().startswith("|") and index + 1 < len(lines)
                    and TABLE_RULE.match(lines[index + 1]) is not None)
        if is_table and not section[2] and not section[3]:
            problems.append(f"{page}:{section[0]}: section '{section[1]}' has a table but no "
                            f"'Regenerate: `command`' line before it")
            section[3] = True
    return problems


def refresh(root: Path = ROOT, page: Path = PAGE) -> tuple[list[str], str | None]:
    """(problems, new page text or None when nothing changes). Raises PageError when the page cannot be read."""
    file = root / page
    if not file.is_file():
        raise PageError(f"{page}: file not found")
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines()
    blocks = find_blocks(lines, str(page))
    problems, errors, out, last = [], [], [], 0
    for block in blocks:
        try:
            wanted = block_text(render_source(block.source, root))
        except PageError as error:
            errors.append(f"{page}:{block.start + 1}: {error}")
            continue
        if wanted != block.text:
            problems.append(f"{page}:{block.start + 1}: stale block '{block.source}': differs from the file "
                            f"(refresh: python -m evaluation.tools.results_page)")
        out += lines[last:block.start + 1]
        out.append(wanted[:-1])   # the block's lines, joined below with the others
        last = block.end
    if errors:
        raise PageError("\n".join(errors))
    out += lines[last:]
    new_text = "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")
    problems += missing_regenerate(lines, blocks, str(page))
    return problems, (new_text if new_text != text else None)


def write_atomically(file: Path, text: str) -> None:
    """Write to a temporary file beside `file`, then rename it over `file`: readers see the old or the new page."""
    descriptor, temporary = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if file.exists():
            os.chmod(temporary, file.stat().st_mode & 0o7777)
        os.replace(temporary, file)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with one line per stale block or missing Regenerate line")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page, relative to the root (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        problems, new_text = refresh(args.root, args.page)
    except PageError as error:
        for line in str(error).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2 if not args.check else 1
    if args.check:
        for line in problems:
            print(line)
        return 1 if problems else 0
    if new_text is not None:
        write_atomically(args.root / args.page, new_text)
    stale = [line for line in problems if "stale block" in line]
    others = [line for line in problems if "stale block" not in line]
    for line in others:
        print(line)
    print(f"{args.page}: {len(stale)} block(s) refreshed" if stale else f"{args.page}: every block is current")
    return 1 if others else 0


if __name__ == "__main__":
    sys.exit(main())
