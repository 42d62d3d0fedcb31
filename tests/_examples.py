"""The ```bash and ```python blocks of a Markdown page as examples to run, in order, in one folder.

A block runs as written unless the line right before its fence is a note:

- ``<!-- example: skip: REASON -->``: not run; the reason is shown in the test's output;
- ``<!-- example: setup=NAME[,NAME...] -->``: the named stand-ins are prepared in the folder first
  (a small checkpoint at the path the text uses, a few images...), once a page; a stand-in may
  also give Python lines that run before a Python block (the names the block takes as given),
  and change the environment of the page's blocks from then on (a local server to download from).

Bash blocks run with ``bash -e``, so any failing line fails the block; Python blocks run as a
script. Each runs in a new process with a time limit; a failure names the page, the block's line
and its first line, with the end of its output.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LANGUAGES = ("bash", "python")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NOTE = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")
TAIL = 3000  # characters of a failed block's output shown

# A stand-in: prepares files in the folder (or the environment the page's blocks run in), returns
# Python lines for the blocks that name it (or "").
Setup = Callable[[Path], str]


@dataclass(frozen=True)
class Example:
    """One code block of a page, with what its note says."""

    page: str
    line: int  # the line of its opening fence
    lang: str
    code: str
    setups: tuple[str, ...] = ()
    skip: str | None = None

    @property
    def first_line(self) -> str:
        first = next((line.strip() for line in self.code.splitlines() if line.strip()), "")
        return first.split("  #")[0].rstrip()  # a command's comment aside

    @property
    def where(self) -> str:
        return f"{self.page}, line {self.line}: `{self.first_line}`"


class ExampleFailed(AssertionError):
    """An example that did not run to the end."""


def parse_note(text: str) -> tuple[tuple[str, ...], str | None]:
    """(stand-ins, skip reason) of a note's text (what follows ``example:``).

    Raises:
        ValueError: a note that is neither ``skip: REASON`` nor ``setup=NAME[,NAME...]``.
    """
    if text.startswith("skip:") and text[5:].strip():
        return (), text[5:].strip()
    if text.startswith("setup=") and text[6:].strip():
        return tuple(name.strip() for name in text[6:].split(",")), None
    raise ValueError(f"example note {text!r}: expected 'skip: REASON' or 'setup=NAME[,NAME...]'")


def examples(text: str, page: str) -> list[Example]:
    """The bash and Python blocks of a page's text, in order, each with its note.

    Raises:
        ValueError: a malformed note (naming the page and line).
    """
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) not in LANGUAGES:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        note = NOTE.fullmatch(before)
        try:
            setups, skip = parse_note(note.group(1)) if note else ((), None)
        except ValueError as e:
            raise ValueError(f"{page}, line {line - 1}: {e}") from None
        out.append(Example(page, line, m.group(1), m.group(2), setups, skip))
    return out


def run_example(example: Example, folder: Path, env: dict[str, str], prelude: str = "", timeout: float = 120) -> None:
    """Run one block in ``folder``: bash with ``-e``, Python as a script after ``prelude``.

    Raises:
        ExampleFailed: a non-zero exit or a block still running after ``timeout`` seconds.
    """
    if example.lang == "bash":
        command = ["bash", "-e", "-o", "pipefail", "-c", example.code]
    else:
        script = folder.parent / f"example_line_{example.line}.py"
        script.write_text(prelude + example.code)
        command = [sys.executable, str(script)]
    try:
        result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ExampleFailed(f"{example.where}: still running after {timeout:.0f} s") from None
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-TAIL:]
        raise ExampleFailed(f"{example.where}: failed (exit {result.returncode})\n{output}")


def _cpu_seconds() -> float:
    """CPU seconds of this process and its finished children: a block's cost on a busy machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_page(
    blocks: list[Example], folder: Path, env: dict[str, str], setups: dict[str, Setup], timeout: float = 120
) -> list[str]:
    """Run a page's blocks in order in ``folder``, preparing each stand-in before the first block
    that names it.

    Returns:
        One line for each block: where it is, and the seconds it took, wall and CPU (its stand-ins
        included), or why it was skipped.

    Raises:
        ExampleFailed: the first block that failed.
        KeyError: a note naming a stand-in that ``setups`` does not have.
    """
    report, prepared = [], {}
    for example in blocks:
        if example.skip is not None:
            report.append(f"{example.where}: skipped ({example.skip})")
            continue
        start, cpu = time.perf_counter(), _cpu_seconds()
        for name in example.setups:
            if name not in prepared:
                prepared[name] = setups[name](folder)
        prelude = "".join(prepared[name] for name in example.setups)
        run_example(example, folder, env, prelude, timeout)
        took = f"{time.perf_counter() - start:.1f} s ({_cpu_seconds() - cpu:.1f} s of CPU)"
        report.append(f"{example.where}: ran in {took}")
    return report
