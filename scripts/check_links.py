#!/usr/bin/env python3
"""Checks that every relative link in README.md and docs/*.md names a file of the clone and,
where it names a heading (page.md#heading), a heading of that page (GitHub's anchors: lower
case, punctuation dropped, spaces as hyphens). Prints each broken link and exits 1.

  python3 scripts/check_links.py [ROOT]
"""
import glob
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def anchors(page):
    out = set()
    in_code = False
    for line in open(page, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.strip().lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


broken = []
pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
for page in pages:
    text = open(page, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code blocks are code
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        link = m.group(1)
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        where = os.path.relpath(page, root)
        if not os.path.exists(target):
            broken.append(f"{where}: link {link}: no such file")
        elif anchor and target.endswith(".md") and anchor not in anchors(target):
            broken.append(f"{where}: link {link}: no heading '{anchor}' in {os.path.relpath(target, root)}")
for b in broken:
    print(b)
print(f"check_links: {len(pages)} pages, {len(broken)} broken links")
sys.exit(1 if broken else 0)
