"""Write the generated reference pages from their one source of truth.

- ``docs/reference/cli.md``: every command's ``--help``, from the parsers themselves;
- ``docs/reference/recipe.md``: every recipe key with its type, default, allowed range or choices and
  meaning, from the recipe's field declarations (``vitkit.train.config``) and their comments.

    python tools/gen_reference.py          # rewrite the pages
    python tools/gen_reference.py --check  # exit 1 if a page is out of date (the tests run this)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import os
import sys
import tokenize
import typing
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def cli_page() -> str:
    """The command line's reference: the top-level help, then each command's."""
    from vitkit.cli import COMMANDS, build_parser

    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal; the page must not depend on it, and fit it
    parser = build_parser()
    out = ["# Command line\n", "Generated from the parsers (`python tools/gen_reference.py`).\n"]
    out += ["```text", parser.format_help().rstrip(), "```\n"]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in COMMANDS:
        out += [f"## vitkit {name}\n", "```text", subparsers.choices[name].format_help().rstrip(), "```\n"]
    return "\n".join(out)


def _comments(cls: type) -> dict[str, str]:
    """The comment written after each field of a dataclass, by field name."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    trailing: dict[int, str] = {}  # a comment after code on its line
    alone: dict[int, str] = {}  # a line of its own
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            own_line = not lines[tok.start[0] - 1][: tok.start[1]].strip()
            (alone if own_line else trailing)[tok.start[0]] = text
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, block = node.lineno - 1, []
            while above in alone:  # the comment lines right above the field
                block.insert(0, alone[above])
                above -= 1
            text = " ".join([*block, trailing.get(node.end_lineno, "")]).strip()
            out[node.target.id] = text
    return out


def _type_name(hint: object) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    return getattr(hint, "__name__", text) if not typing.get_args(hint) else text


def recipe_page() -> str:
    """Every recipe key: section by section, its type, default, range or choices and meaning."""
    from vitkit.train.config import Recipe

    out = [
        "# Recipe keys\n",
        "Generated from the recipe's field declarations (`vitkit.train.config`; `python "
        "tools/gen_reference.py`). A recipe is a YAML file of these sections; `--set section.key=value` "
        "changes one key on the command line. A value outside its range, or a key that is not here, "
        "is refused in one line naming the key.\n",
    ]
    hints, top_comments = typing.get_type_hints(Recipe), _comments(Recipe)
    for top in dataclasses.fields(Recipe):
        cls = hints[top.name]
        if not dataclasses.is_dataclass(cls):
            allowed = f", in {top.metadata['check'].spec}" if "check" in top.metadata else ""
            out.append(
                f"- `{top.name}` ({_type_name(cls)}, default `{top.default!r}`{allowed}): {top_comments[top.name]}\n"
            )
            continue
        out += [f"## {top.name}\n", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        types, comments = typing.get_type_hints(cls), _comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            check = f.metadata.get("check")
            allowed = ""
            if check is not None:
                allowed = ", ".join(check.choices) if check.choices else check.spec
            meaning = comments.get(f.name, "").replace("|", "\\|")
            out.append(
                f"| `{top.name}.{f.name}` | {_type_name(types[f.name]).replace('|', 'or')} | `{default!r}` | "
                f"{allowed.replace('|', 'or')} | {meaning} |"
            )
        out.append("")
    return "\n".join(out)


PAGES = {"reference/cli.md": cli_page, "reference/recipe.md": recipe_page}
START, END = "<!-- reproduce-summary:start -->", "<!-- reproduce-summary:end -->"


def readme_with_summary(readme: str) -> str:
    """``readme`` with the block between the summary markers replaced by the headline table of the
    published reproduction report (``docs/reproduce/report.json``)."""
    import json

    from vitkit.reproduce.core.report import headline_table, provenance

    if START not in readme or END not in readme:
        return readme
    published = DOCS / "reproduce" / "report.json"
    if published.is_file():
        report = json.loads(published.read_text())
        m = report["meta"]
        table = headline_table(report["experiments"])
        made = (
            f"From `{m['command']}` on {m['date'][:10]}: {m['machine']['cpu']}, {m['machine']['cores']} cores, "
            f"torch {m['machine']['torch']}, vitkit `{m['machine'].get('commit') or 'unknown'}`. "
            + provenance(report.get("runs") or {})
        ).strip()
        block = f"{made}\n\n{table}"
    else:
        block = "No report has been published yet: `make reproduce` writes one into `docs/reproduce/`."
    head, rest = readme.split(START, 1)
    return f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}"


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for name, make in PAGES.items():
        path, text = DOCS / name, make().rstrip() + "\n"
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    readme = DOCS.parent / "README.md"
    text = readme.read_text()
    fresh = readme_with_summary(text)
    if check and fresh != text:
        stale.append("README.md (the reproduction summary)")
    elif not check and fresh != text:
        readme.write_text(fresh)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python tools/gen_reference.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
