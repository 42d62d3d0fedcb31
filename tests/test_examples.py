"""Every example of the README and the guides runs: each page's ```bash and ```python blocks are
executed in order in one fresh folder, as a reader would type them (``vitkit`` from this
checkout), on small stand-ins where the real thing needs a download, a data set or hours
(``tests/_standins.py``); a block that cannot run in a test says why in a note before its fence
(``tests/_examples.py``). A block that breaks fails its page's test, naming the page and the
block's first line."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from _examples import ExampleFailed, examples, run_example, run_page
from _hub import HubStandIn
from _standins import StandIns

REPO = Path(__file__).resolve().parents[1]
# docs/reference/ and docs/reproduce/ are generated; their blocks are checked where they are made.
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Pages whose examples take longer than the default run affords; `make test-all` runs them.
SLOW_PAGES = {
    "models.md": "every family built, converted and analysed on stand-ins: ~15 s of CPU",
    "README.md": "the quick start's embed, probe and training commands on stand-ins: ~80 s of CPU",
    "training.md": "a dozen short training runs, torchrun among them: ~100 s of CPU",
    "evaluation.md": "the README's evaluation commands again, with int8 and predict: ~40 s of CPU",
    "serving.md": "int8 and bf16 serving, an ONNX and a torch.export conversion: ~45 s of CPU",
    "weights.md": "six conversions, ONNX and torch.export among them, and nine downloads, six of ViT-B's size: "
    "~140 s of CPU",
}
TIMEOUT = 600  # seconds a block may take (a few on an idle machine; far more on a busy one)


def example_env(home: Path) -> dict[str, str]:
    """The environment of the examples: ``vitkit``, ``python`` and ``torchrun`` of this checkout
    first on the PATH; data, caches and Hugging Face's home under ``home``; offline, so nothing is
    downloaded (the ``hub`` stand-in puts a page online, against the local stand-in of the servers)."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shims = {
        "vitkit": f'"{sys.executable}" -m vitkit',
        "python": f'"{sys.executable}"',
        "torchrun": f'"{sys.executable}" -m torch.distributed.run',
    }
    for name, command in shims.items():
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])),
        VITKIT_DATA=str(home / "data"),
        VITKIT_CACHE=str(home / "cache"),
        HF_HOME=str(home / "hf"),
        VITKIT_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        MPLBACKEND="Agg",
    )
    env.pop("VITKIT_MIRROR", None)
    return env


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """Where the stand-ins that take a while are built once, for every page."""
    return tmp_path_factory.mktemp("examples_shared")


@pytest.fixture(scope="module")
def hub(shared):
    """The local stand-in of the servers weights are downloaded from, for the pages that download."""
    server = HubStandIn(shared / "hub")
    yield server
    server.close()


def test_every_note_before_a_block_is_known():
    names = StandIns(Path(), {}).setups()
    for page in PAGES:
        for example in examples(page.read_text(), page.name):
            unknown = set(example.setups) - set(names)
            assert not unknown, f"{example.where}: no stand-in named {', '.join(sorted(unknown))}"


@pytest.mark.parametrize(
    "page", [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW_PAGES else []) for p in PAGES]
)
def test_every_example_of_the_page_runs(page, shared, hub, tmp_path):
    blocks = examples(page.read_text(), page.relative_to(REPO).as_posix())
    stand_ins = StandIns(shared, example_env(tmp_path / "home"), hub)
    folder = tmp_path / "reader"
    folder.mkdir()
    try:
        report = run_page(blocks, folder, stand_ins.env, stand_ins.setups(), TIMEOUT)
    except ExampleFailed as e:
        pytest.fail(str(e), pytrace=False)
    print("\n".join(report))
    if blocks and all(b.skip is not None for b in blocks):
        pytest.skip(f"every block of {page.name} is skipped: " + "; ".join(report))


SYNTHETIC = """# A page

Works:

```bash
echo one > one.txt
```

<!-- example: skip: would take hours -->
```bash
sleep 3600
```

```python
from pathlib import Path
assert Path("one.txt").read_text() == "one\\n"
```

```text
not code
```

Breaks:

```bash
echo two
vitkit train --out runs/x --no-such-flag
echo three
```
"""


def test_a_block_that_breaks_fails_naming_the_page_and_its_first_line(tmp_path):
    blocks = examples(SYNTHETIC, "page.md")
    assert [(b.lang, b.line, b.skip) for b in blocks] == [
        ("bash", 5, None),
        ("bash", 10, "would take hours"),
        ("python", 14, None),
        ("bash", 25, None),
    ]
    folder = tmp_path / "reader"
    folder.mkdir()
    env = example_env(tmp_path / "home")
    with pytest.raises(ExampleFailed, match=r"page.md, line 25: `echo two`: failed \(exit 2\)") as failed:
        run_page(blocks, folder, env, {})
    assert "unrecognized arguments: --no-such-flag" in str(failed.value) and "three" not in str(failed.value)
    report = run_page(blocks[:3], folder, env, {})
    assert report[1] == "page.md, line 10: `sleep 3600`: skipped (would take hours)"
    assert report[0].startswith("page.md, line 5: `echo one > one.txt`: ran in ")


def test_a_python_block_that_raises_or_hangs_fails(tmp_path):
    (folder := tmp_path / "reader").mkdir()
    env = example_env(tmp_path / "home")
    raising, hanging = examples('```python\nraise ValueError("no")\n```\n```bash\nsleep 30\n```\n', "p.md")
    with pytest.raises(ExampleFailed, match=r"(?s)p.md, line 1: `raise ValueError\(\"no\"\)`: failed.*ValueError"):
        run_example(raising, folder, env)
    with pytest.raises(ExampleFailed, match=r"p.md, line 4: `sleep 30`: still running after 1 s"):
        run_example(hanging, folder, env, timeout=1)


def test_a_malformed_note_is_refused():
    with pytest.raises(ValueError, match=r"p.md, line 1: example note 'skip'"):
        examples("<!-- example: skip -->\n```bash\nls\n```\n", "p.md")
