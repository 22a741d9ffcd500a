"""The code blocks of README.md and the docs site, found by a small extractor of its own.

A block is a fenced block (``` or ~~~, inside MyST directives too, whose content is Markdown),
MyST's `{code-block} LANG`, or a `{literalinclude}` (its text the file's). Each keeps the
`<!-- not run: REASON -->` marker on the line directly above its fence, if any.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The pages: the README and the site's sources (not a build or extension folder: docs/_*).
PAGES = [ROOT / "README.md"]
PAGES += sorted(p for p in (ROOT / "docs").rglob("*.md") if not p.relative_to(ROOT / "docs").parts[0].startswith("_"))
#: The language of a `{literalinclude}` without `:language:`, by the file's suffix.
SUFFIX_LANGUAGE = {".py": "python", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}
SUFFIX_LANGUAGE |= {".ini": "ini", ".cfg": "ini", ".sh": "sh", ".service": "systemd", ".socket": "systemd"}
#: The directives whose content is the code itself; every other directive's content is Markdown to search.
CODE_DIRECTIVES = {"code-block", "code", "sourcecode"}
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
DIRECTIVE = re.compile(r"^\{(?P<name>[\w-]+)\}\s*(?P<argument>.*)$")


@dataclass(frozen=True)
class Block:
    """One code block: where its fence is, its language, its text and the not-run reason above it."""

    page: Path
    line: int  #: 1-based line of the opening fence (of the directive for a literalinclude)
    language: str
    text: str
    first_line: int  #: 1-based line of the text's first line in `source`
    not_run: str | None = None
    source: Path | None = None  #: the file the text is from, when it is not the page (a literalinclude)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def __str__(self) -> str:
        return self.where


def is_closing(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(line) - len(line.lstrip(" ")) < 4 and bool(
        re.fullmatch(re.escape(fence[0]) + f"{{{len(fence)},}}", stripped)
    )


def page_blocks(page: Path) -> list[Block]:
    """Return the code blocks of one Markdown page, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    containers: list[str] = []  # fences of the directives we are inside (their content is Markdown)
    index = 0
    while index < len(lines):
        line = lines[index]
        if containers and is_closing(line, containers[-1]):
            containers.pop()
            index += 1
            continue
        match = FENCE.match(line)
        if not match or (match["fence"][0] == "`" and "`" in match["info"]):
            index += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        marker = NOT_RUN.match(lines[index - 1]) if index else None
        reason = marker["reason"].strip() if marker else None
        directive = DIRECTIVE.match(info)
        if directive and directive["name"] not in CODE_DIRECTIVES | {"literalinclude"}:
            containers.append(fence)
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not is_closing(lines[end], fence):
            end += 1
        body = [text.removeprefix(match["indent"]) for text in lines[index + 1 : end]]
        first = index + 2
        if directive and directive["name"] == "literalinclude":
            found.append(included_block(page, index + 1, directive["argument"], body, reason))
        else:
            words = (directive["argument"] if directive else info).split()
            language = words[0] if words else ""
            while directive and body and re.match(r"^:[\w-]+:", body[0]):  # a code directive's options
                body, first = body[1:], first + 1
            found.append(Block(page, index + 1, language.lower(), "\n".join(body), first, reason))
        index = end + 1
    return found


def included_block(page: Path, line: int, argument: str, options: list[str], reason: str | None) -> Block:
    """Return a `{literalinclude}` as a block of the file it includes (a path from / is from docs/)."""
    source = (ROOT / "docs" / argument.lstrip("/")) if argument.startswith("/") else (page.parent / argument)
    language = next((o.split(":", 2)[2].strip() for o in options if o.startswith(":language:")), "")
    language = language or SUFFIX_LANGUAGE.get(source.suffix, "")
    text = source.read_text() if source.is_file() else ""
    return Block(page, line, language.lower(), text, 1, reason, source.resolve())
