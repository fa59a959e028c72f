#!/usr/bin/env python3
"""Check that splitting the README into docs/ pages lost no fact.

Usage: python3 scripts/check_readme_split.py [OLD_REV]   (default: the
last commit whose README.md had more than 250 lines)

Every sentence, table row and code line of the old README.md, section by
section (## / ### / ####), must appear, whitespace- and link-normalised, in
the new README.md or some docs/*.md. Prints one line per section with its
count of pieces and each piece not found; exits 1 when any is missing, so a
reviewer sees exactly which sentences were reworded and can check them.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def old_readme(rev):
    if rev is None:
        revs = subprocess.run(
            ["git", "log", "--format=%H", "--", "README.md"],
            cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
        for r in revs:
            text = show(r)
            if text.count("\n") > 250:
                return r, text
        sys.exit("no commit has a README.md over 250 lines; name one")
    return rev, show(rev)


def show(rev):
    return subprocess.run(["git", "show", f"{rev}:README.md"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout


def norm(s):
    # Links become their text, so a cross-reference turned into a link still
    # counts; emphasis and whitespace do not matter.
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = s.replace("**", "").replace("\"", "")
    return re.sub(r"\s+", " ", s).strip()


def pieces(body):
    """Sentences of prose, rows of tables, lines of code."""
    out, para, fenced = [], [], False

    def flush():
        text = " ".join(para)
        para.clear()
        # Bullets are prose too; their marker is not content.
        text = re.sub(r"^- ", "", text)
        for sent in re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(\"*])", text):
            if len(norm(sent)) > 3:
                out.append(sent)

    for line in body.split("\n"):
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced or line.startswith("    ") and not para or line.startswith("|"):
            flush()
            if line.strip() and not re.fullmatch(r"[|\s:-]+", line):
                out.append(line)
            continue
        if not line.strip() or line.startswith("- "):
            flush()
        if line.strip():
            para.append(line.strip())
    flush()
    return out


def main():
    rev, text = old_readme(sys.argv[1] if len(sys.argv) > 1 else None)
    new = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    haystack = norm("\n".join(p.read_text() for p in new))
    sections, cur = [("(top)", [])], None
    for line in text.split("\n"):
        m = re.match(r"^(#{1,4}) (.*)", line)
        if m:
            sections.append((m.group(2), []))
        else:
            sections[-1][1].append(line)
    missing_total = 0
    print(f"old README: {rev[:12]}, {text.count(chr(10))} lines; new: "
          + ", ".join(str(p.relative_to(ROOT)) for p in new))
    for title, lines in sections:
        ps = pieces("\n".join(lines))
        missing = [p for p in ps if norm(p) not in haystack]
        missing_total += len(missing)
        print(f"{'OK  ' if not missing else 'MISS'} {title}: {len(ps) - len(missing)}/{len(ps)} found")
        for p in missing:
            print(f"       not found: {norm(p)[:160]}")
    print(f"{missing_total} pieces not found verbatim")
    sys.exit(1 if missing_total else 0)


if __name__ == "__main__":
    main()
