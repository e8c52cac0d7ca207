"""One word per idea (docs/ARCHITECTURE.md, glossary), checked in code, help texts and
docs: the glossary's banned synonyms appear nowhere, and every repository path named in
a doc or a docstring exists.

docs/journal/ is a dated history and keeps the words of its day; bench/results/ holds
measurements, not prose.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("*.py", "*.md", "*.html", "*.js", "*.txt", "*.toml", "Makefile")
SKIPPED = ("docs/journal/", "bench/results/", "tests/test_vocabulary.py")
# Banned phrase -> the glossary's word for it.
BANNED = {
    r"\bouter[ -]gradients?": "update",
    r"\blive (?:runs?|islands?)\b": "a running or paused run, an alive island (live: pushed to "
                                "open pages as it happens)",
    r"\b(?:is|are|not) live\b(?! to)": "running or paused, alive (live: pushed to open pages)",
    r"\b(?:island|simulation|sweep|chaos) specs?\b": "the island config, the sweep, the chaos "
                                                  "preset (spec: the run spec alone)",
    r"\bisland restarts?\b": "a rejoin, the island's next epoch (restart: elastic's whole-job "
                           "restart)",
}
# Where a doc or docstring names a path, it is read from the repository's root or, for
# the web app's static files and templates, from where Django finds them.
PATH = re.compile(r"(?<![\w./-])((?:diloco|syncd|trainer|webapp|bench|tests|docs|dashboard|"
                  r"static|templates)/[\w./-]*\w\.(?:py|md|js|html|json|css|toml|yaml|sh))\b")
PATH_ROOTS = ("", "webapp/dashboard/", "webapp/dashboard/static/", "templates/")
# Paths that are named on purpose and made elsewhere: placeholders, files a command
# writes (bench/results, uncommitted), plotly's static files (the plotly package's) and
# the modules of the unbuilt design.
NOT_FILES = re.compile(r"[A-Z]{2,}|^bench/results/|^static/plotly/")
UNBUILT = {"syncd/fragment_sync.py", "syncd/reports.py"}


def checked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                             *CHECKED], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split()
            if not name.startswith(SKIPPED) and (ROOT / name).is_file()]


def test_no_banned_synonym_of_the_glossary_is_used():
    banned = re.compile("|".join(f"(?:{phrase})" for phrase in BANNED), re.IGNORECASE)
    found = []
    for path in checked_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in banned.finditer(line):
                word = next(f"say {say!r}" for phrase, say in BANNED.items()
                            if re.fullmatch(phrase, match.group(0), re.IGNORECASE))
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}: {word}")
    assert not found, "banned synonyms (docs/ARCHITECTURE.md, glossary):\n" + "\n".join(found)


def test_every_path_a_doc_or_docstring_names_exists():
    missing = []
    for path in checked_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in PATH.finditer(line):
                named = match.group(1)
                if NOT_FILES.search(named) or named in UNBUILT:
                    continue
                if not any((ROOT / base / named).exists() for base in PATH_ROOTS):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {named}")
    assert not missing, "paths named that do not exist:\n" + "\n".join(missing)
