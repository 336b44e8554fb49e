#!/usr/bin/python3
"""Checks the relative links of README.md and docs/*.md: every linked file exists, and every
#anchor names a heading of the page it points to (GitHub's rule: lower case, spaces to '-',
punctuation other than '-' and '_' dropped). Run by ctest as docs_links. With --readme-max-lines N
(ctest docs_readme_length) it checks instead that README.md, the front door, has at most N lines.

    python3 tests/docs/check_links.py [REPO_ROOT] [--readme-max-lines N]
"""
import glob
import os
import re
import sys

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
ROOT = ARGS[0] if ARGS and not ARGS[0].isdigit() else os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path):
    """The anchors of a markdown file's headings (outside fenced blocks)."""
    out, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(slug)
    return out


def readme_length(max_lines):
    n = len(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines())
    print(f"README.md: {n} lines (at most {max_lines})")
    if n > max_lines:
        print(f"README.md has {n} lines, more than {max_lines}: move details to a docs/ page",
              file=sys.stderr)
        return 1
    return 0


def main():
    if "--readme-max-lines" in sys.argv:
        return readme_length(int(sys.argv[sys.argv.index("--readme-max-lines") + 1]))
    pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bad = []
    for page in pages:
        text = open(page, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code blocks are not links
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            rel = os.path.relpath(page, ROOT)
            if not os.path.exists(full):
                bad.append(f"{rel}: link to {target}: {os.path.relpath(full, ROOT)} does not exist")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                bad.append(f"{rel}: link to {target}: no heading with anchor #{anchor}")
    for line in bad:
        print(line, file=sys.stderr)
    print(f"{len(pages)} pages checked, {len(bad)} broken links")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
