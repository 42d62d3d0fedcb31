"""The README and the documentation stay true: generated pages current, every command line in them
accepted by the command line's own parser, every Python block valid, every link resolving, and the
site building with --strict where mkdocs is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vitkit.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def _blocks(lang: str) -> list[tuple[str, str]]:
    return [(p.name, m.group(2)) for p in PAGES for m in BLOCK.finditer(p.read_text()) if m.group(1) == lang]


def _command_lines() -> list[tuple[str, str]]:
    out = []
    for page, block in _blocks("bash"):
        until = None  # the word that ends a here-document: its lines are data, not commands
        for line in block.splitlines():
            if until is not None:
                until = None if line.strip() == until else until
                continue
            if heredoc := re.search(r"<<-?\s*['\"]?(\w+)", line):
                until = heredoc.group(1)
            line = " ".join(shlex.split(line, comments=True))
            if "vitkit " in line and not line.startswith(("pip", "python")):
                out.append((page, line[line.index("vitkit ") :]))
            elif line.startswith("make "):
                out.append((page, line))
    return out


def test_the_generated_reference_is_current():
    result = subprocess.run([sys.executable, str(REPO / "tools" / "gen_reference.py"), "--check"], capture_output=True)
    assert result.returncode == 0, result.stdout.decode()


@pytest.mark.parametrize(("page", "line"), _command_lines())
def test_every_command_line_in_the_docs_parses(page, line):
    words = line.split()
    if words[0] == "make":
        targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M)
        assert words[1] in targets, f"{page}: make {words[1]} is not a target"
        return
    try:
        build_parser().parse_args(words[1:])
    except SystemExit as e:
        pytest.fail(f"{page}: `{line}` is refused by the parser (exit {e.code})")


@pytest.mark.parametrize(("page", "code"), _blocks("python"))
def test_every_python_block_in_the_docs_compiles(page, code):
    compile(code, page, "exec")


def test_every_link_in_the_readme_resolves():
    text = (REPO / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target


def _build_site(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the site whose mkdocs.yml is in ``root``, as ``make docs``
    runs it: without ``--quiet``, which would keep warnings from the strict count."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


def _warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if "WARNING" in line]


def test_the_make_docs_target_counts_warnings():
    recipe = re.search(r"^docs:.*?(?=^\S|\Z)", (REPO / "Makefile").read_text(), re.M | re.S).group(0)
    assert "mkdocs build --strict" in recipe and "--quiet" not in recipe and "-q " not in recipe.split("mkdocs")[-1]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    result = _build_site(REPO, tmp_path / "site")
    assert result.returncode == 0 and not _warnings(result), "\n".join(_warnings(result)) or result.stderr[-2000:]
    site = tmp_path / "site"
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "load_pretrained" in api and not re.search(r":(func|meth|class|attr|mod|data):<code>", api)
    assert api.index('id="vitkit.create_model"') < api.index('id="vitkit.VitkitError"')  # by use, errors last
    assert not list(site.rglob("*.py")) and not (site / "gen_reference").exists()  # build tools are not pages
    for page in site.rglob("index.html"):  # a list whose items Markdown took for one paragraph's lines
        unrendered = [p[:80] for p in re.findall(r"<p>(.*?)</p>", page.read_text(), re.S) if re.search(r"\n\s*- ", p)]
        assert not unrendered, f"{page.relative_to(site)}: a list rendered as a paragraph: {unrendered[0]}"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert cli.count('<div class="highlight wrap">') == cli.count('<div class="highlight')  # --help wraps


@pytest.mark.slow
def test_a_broken_link_fails_the_site_build(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for entry in REPO.iterdir():  # what the pages include (README.md, CHANGELOG.md, src...)
        if not (tmp_path / entry.name).exists() and entry.name not in ("site", ".git"):
            (tmp_path / entry.name).symlink_to(entry)
    page = tmp_path / "docs" / "speed.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = _build_site(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert any("no-such-page.md" in line for line in _warnings(result))
