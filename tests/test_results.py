"""benchmarks/RESULTS.md stays rerunnable and true to its data: every table names the command that
reruns it, the machine, the torch version and the date, and every number a table shows from a JSON
file in benchmarks/results/ equals that file's value to the digits shown."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"
RESULTS_DIR = REPO / "benchmarks" / "results"

RUN_LINE = re.compile(
    r"^Command: (?P<command>.+?) · Machine: (?P<machine>.+?) · (?P<torch>torch .+?) · Date: (?P<date>.+)$"
)
# A command line, after any VAR=value settings in front of it.
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S+ +)*(?:python benchmarks/|make |vitkit |bash benchmarks/)")
MACHINE = re.compile(r"AMD EPYC|Intel|NVIDIA")
TORCH = re.compile(r"^torch \d+\.\d+\.\d+")
DATE = re.compile(r"^(?:\d{4}-\d{2}-\d{2}|not recorded)")
MARKER = re.compile(r"^<!-- results: (?P<name>[\w.-]+\.json)(?P<args>(?: \w+=\S+)*) -->$")
SEPARATOR = re.compile(r"^\|(?: *:?-+:? *\|)+$")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

# The peers' column headings in RESULTS.md, as peers.py names them.
PEER_COLUMNS = {
    "vitkit": "vitkit",
    "vitkit auto": "vitkit-auto",
    "timm": "timm",
    "HF sdpa": "hf-sdpa",
    "HF eager": "hf-eager",
}
PEER_COLUMNS["torchvision"] = "torchvision"
PEER_COLUMNS |= {"OpenVINO": "openvino", "ONNX Runtime": "onnxruntime", "ONNX Runtime QDQ": "onnxruntime-qdq"}


@dataclass
class Table:
    line: int  # 1-based line of the header row
    heading: str
    header: list[str]
    rows: list[list[str]]
    before: list[str] = field(default_factory=list)  # the lines since the last heading or table
    run: dict[str, str] | None = None
    marker: tuple[str, dict[str, str]] | None = None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> list[Table]:
    """The tables of a Markdown page, each with the run line and results marker above it."""
    lines = text.splitlines()
    tables: list[Table] = []
    heading, since, i = "", [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading, since = line.lstrip("#").strip(), []
        elif line.startswith("|") and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1].strip()):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            table = Table(i + 1, heading, _cells(line), [_cells(r) for r in lines[i + 2 : j]], before=since)
            runs = [m.groupdict() for m in map(RUN_LINE.match, since) if m]
            table.run = runs[-1] if runs else None
            if i > 0 and (m := MARKER.match(lines[i - 1].strip())):
                args = dict(a.split("=", 1) for a in m.group("args").split())
                table.marker = (m.group("name"), args)
            tables.append(table)
            since, i = [], j
            continue
        else:
            since = [*since, line]
        i += 1
    return tables


TABLES = parse_tables(RESULTS_MD.read_text())


def _id(table: Table) -> str:
    return f"line {table.line}: {table.heading}"


def shown_equals(cell: str, value: float) -> bool:
    """Whether the first number in a cell is `value` rounded to the digits the cell shows."""
    m = NUMBER.search(cell)
    if m is None:
        return False
    shown = m.group().replace(",", "")
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10**-decimals + 1e-9


def test_results_has_tables():
    assert len(TABLES) >= 15, "benchmarks/RESULTS.md lost its tables, or the parser its way"


@pytest.mark.parametrize("table", TABLES, ids=_id)
def test_every_table_names_its_run(table: Table):
    assert table.run, f"no 'Command: ... · Machine: ... · torch ... · Date: ...' line above the table at {_id(table)}"
    commands = re.findall(r"`([^`]+)`", table.run["command"])
    assert any(COMMAND.match(c) for c in commands), f"no python benchmarks/, make, vitkit command: {table.run}"
    assert MACHINE.search(table.run["machine"]), f"no CPU or GPU named: {table.run['machine']}"
    assert TORCH.match(table.run["torch"]), f"no torch version: {table.run['torch']}"
    assert DATE.match(table.run["date"]), f"a date or 'not recorded': {table.run['date']}"


def test_every_result_file_is_shown():
    shown = {t.marker[0] for t in TABLES if t.marker}
    files = {p.name for p in RESULTS_DIR.glob("*.json")}
    assert files, "benchmarks/results/ holds no JSON"
    assert shown - files == set(), f"marked in RESULTS.md but not in benchmarks/results/: {shown - files}"
    assert files - shown == set(), f"in benchmarks/results/ but shown by no marked table: {files - shown}"


def _torch_of(data: dict) -> str | None:
    return (data.get("meta") or data.get("info") or {}).get("torch")


def _check_cpu_kind(table: Table, data: dict, args: dict[str, str]) -> None:
    """cpu_kind.py: one row a precision (its first word); images/s in two phases, the schedule, the
    images/s per GFLOP/s pair; the torch.mm rates in the text above the table."""
    assert "8 patches" in table.header[1] and "36" in table.header[2] and "schedule" in table.header[3]
    rows = {row[0].split()[0]: row for row in table.rows}
    assert set(rows) == {r["precision"] for r in data["results"]}, "one row per precision in the JSON"
    for result in data["results"]:
        row = rows[result["precision"]]
        assert shown_equals(row[1], result["img_per_s"]["8 patches"]), row
        assert shown_equals(row[2], result["img_per_s"]["36 patches"]), row
        assert shown_equals(row[3], result["schedule_img_per_s"]), row
        per_8, per_schedule = row[4].split("/")
        assert shown_equals(per_8, result["img_per_s_per_gflops_8_patches"]), row
        assert shown_equals(per_schedule, result["img_per_s_per_gflops_schedule"]), row
    text = "\n".join(table.before)
    m = re.search(r"`torch\.mm`: fp32 (\S+) GFLOP/s, bf16 (\S+?)\.?$", text, re.M)
    assert m, "the torch.mm rates above the table"
    assert shown_equals(m.group(1), data["meta"]["mm_gflops"]["fp32"])
    assert shown_equals(m.group(2), data["meta"]["mm_gflops"]["bf16"])


def _check_int8_accuracy(table: Table, data: dict, args: dict[str, str]) -> None:
    """int8_accuracy.py: one row a precision (named in backticks in the first cell); top-1, images/s
    and, where the table has them, the difference from fp32, top-1 agreement and cosines."""
    assert "top-1" in table.header[1] and "images/s" in table.header[2]
    rows = {re.search(r"`([^`]+)`", row[0]).group(1): row for row in table.rows}
    assert set(rows) == {r["precision"] for r in data["rows"]}, "one row per precision in the JSON"
    extra = {"top-1 agreement": "top1_agreement", "cosine, mean": "cosine_mean", "cosine, min": "cosine_min"}
    for result in data["rows"]:
        row = rows[result["precision"]]
        if "skipped" in result:
            assert row[1].startswith("skipped"), row
            continue
        assert shown_equals(row[1], result["top1"]), row
        assert shown_equals(row[2], result["images_per_s"]), row
        for heading, cell in zip(table.header[3:], row[3:]):
            if heading in extra:
                assert shown_equals(cell, result[extra[heading]]), (heading, row)


def _check_peers(table: Table, data: dict, args: dict[str, str]) -> None:
    """peers.py: one row a precision, one column a contender; `rows=` names the rows the file holds
    (others come from other runs), `suite=` the suite where the file holds several."""
    suites = {s["suite"]: s for s in data["suites"]}
    suite = suites[args["suite"]] if "suite" in args else next(iter(suites.values()))
    assert "suite" in args or len(suites) == 1, "name the suite: <!-- results: FILE suite=NAME -->"
    images = {(r["peer"], r["precision"]): r["images_per_s"] for r in suite["rows"] if not r["compile"]}
    wanted = args["rows"].split(",") if "rows" in args else [row[0] for row in table.rows]
    rows = {row[0]: row for row in table.rows}
    for precision in wanted:
        checked = 0
        for heading, cell in zip(table.header[1:], rows[precision][1:]):
            peer = PEER_COLUMNS.get(heading)
            if peer is None or cell.strip() == "-":
                continue
            assert shown_equals(cell, images[(peer, precision)]), (heading, precision, cell)
            checked += 1
        assert checked, f"no contender of the JSON in the {precision} row"


def _check_embed_speed(table: Table, data: dict, args: dict[str, str]) -> None:
    """embed_speed.py: one row a command (its name in backticks in the first cell); median seconds,
    images/s and timm's time over the row's."""
    assert "median s" in table.header[1] and "images/s" in table.header[2]
    rows = {re.search(r"`([^`]+)`", row[0]).group(1): row for row in table.rows}
    assert set(rows) == set(data["rows"]), "one row per command in the JSON"
    for name, result in data["rows"].items():
        row = rows[name]
        assert shown_equals(row[1], result["median_s"]), row
        assert shown_equals(row[2], result["img_per_s"]), row
        assert shown_equals(row[3].rstrip("x"), result["speedup_vs_timm"]), row


def _check_reproduce_budget(table: Table, data: dict, args: dict[str, str]) -> None:
    """reproduce_budget.py: one row a make target (its name in backticks in the first cell); the
    experiments, the runs and the estimated minutes (and, where shown, the longest case's)."""
    assert "runs" in table.header[2] and "minutes" in table.header[3]
    rows = {re.search(r"`([^`]+)`", row[0]).group(1): row for row in table.rows}
    assert set(rows) == {c["call"] for c in data["calls"]}, "one row per call in the JSON"
    for call in data["calls"]:
        row = rows[call["call"]]
        assert row[1] == ", ".join(call["experiments"]), row
        assert shown_equals(row[2], call["runs"]) and shown_equals(row[3], call["minutes"]), row
        if len(table.header) > 4:  # the plateau rule's longest case
            assert "longest" in table.header[4] and shown_equals(row[4], call["minutes_longest"]), row


def _check_loop_overhead(table: Table, data: dict, args: dict[str, str]) -> None:
    """loop_overhead.py: one row; the bare step's and the loop's median images/s and their ratio."""
    (row,) = table.rows
    assert "step" in table.header[1] and "loop" in table.header[2]
    assert shown_equals(row[1], data["step_median"]) and shown_equals(row[2], data["loop_median"]), row
    assert shown_equals(row[3], data["ratio"]), row


def _check_merge_curve(table: Table, data: dict, args: dict[str, str]) -> None:
    """merge_curve.py: one row an r; tokens left, images/s, speed-up over r = 0, top-1 and its change
    ("-" for both where the model was timed with random weights)."""
    assert [int(row[0]) for row in table.rows] == [r["r"] for r in data["rows"]]
    base = next(r for r in data["rows"] if r["r"] == data["baseline_r"])
    for row, r in zip(table.rows, data["rows"]):
        assert shown_equals(row[1], r["tokens_out"]) and shown_equals(row[2], r["images_per_s"]), row
        assert shown_equals(row[3].rstrip("x"), r["images_per_s"] / base["images_per_s"]), row
        if r["top1"] is None:  # a model timed with random weights (--arch): no top-1
            assert row[4] == row[5] == "-", row
            continue
        assert shown_equals(row[4].rstrip("%"), 100 * r["top1"]), row
        assert shown_equals(row[5], 100 * (r["top1"] - base["top1"])), row


def _check_contention(table: Table, data: dict, args: dict[str, str]) -> None:
    """contention.py: one row a setting (its name first in the first cell); alone, beside the
    rival, the worst window beside it and the share kept."""
    for row in table.rows:
        name = row[0].strip("`").split()[0]
        setting = {"OMP_WAIT_POLICY=PASSIVE": "passive"}.get(name, name)
        alone = next(r for r in data["rows"] if r["setting"] == setting and not r["contended"])
        beside = next(r for r in data["rows"] if r["setting"] == setting and r["contended"])
        assert shown_equals(row[1], alone["median"]) and shown_equals(row[2], beside["median"]), row
        assert shown_equals(row[3], beside["worst"]), row
        assert shown_equals(row[4].rstrip("%"), 100 * beside["share_kept"]), row


def _check_adapters(table: Table, data: dict, args: dict[str, str]) -> None:
    """adapters.py --speed: one row a model and method; trainable parameters, images/s, peak memory."""
    assert len(table.rows) == len(data["speed"])
    for row, r in zip(table.rows, data["speed"]):
        assert row[0].startswith(r["model"]) and row[1] == r["method"], row
        assert shown_equals(row[2], r["trainable"]) and shown_equals(row[3], r["images_per_s"]), row
        assert shown_equals(row[4], r["peak_mb"]), row


def _check_naflex_cost(table: Table, data: dict, args: dict[str, str]) -> None:
    """naflex_cost.py: the square, NaFlex and squares-through-NaFlex rows, in that order; real and
    computed patches, the median step and the cost per real patch against the square's."""
    square, naflex, as_naflex = table.rows
    med = data["step_median"]
    expect = [
        (square, data["square_tokens"], data["square_tokens"], med["square"], 1.0),
        (naflex, data["real_tokens"], data["padded_tokens"], med["naflex"], data["per_token_ratio"]),
        (as_naflex, data["square_tokens"], data["square_tokens"], med["squares_as_naflex"], data["mask_ratio"]),
    ]
    for row, real, computed, seconds, ratio in expect:
        shown_real, shown_computed = (c.strip() for c in row[1].split("/"))
        assert shown_equals(shown_real, real) and shown_equals(shown_computed, computed), row
        assert shown_equals(row[2], seconds) and shown_equals(row[3], ratio), row


def _check_naflex_accuracy(table: Table, data: dict, args: dict[str, str]) -> None:
    """naflex_accuracy.py: one row an arm; mean top-1, NaFlex's paired difference from the arm
    with its interval (none on NaFlex's own row) and the median training seconds."""
    assert [row[0] for row in table.rows] == list(data["top1"])
    for row in table.rows:
        arm = row[0]
        assert shown_equals(row[1].rstrip("%"), 100 * statistics.mean(data["top1"][arm])), row
        assert shown_equals(row[3], statistics.median(data["train_seconds"][arm])), row
        if arm == "naflex":
            assert row[2] == "—", row
            continue
        diff = data["naflex_minus"][arm]
        mean, lo, hi = re.fullmatch(r"(\S+) \((\S+) to (\S+)\)", row[2]).groups()
        assert shown_equals(mean, diff["mean"]) and shown_equals(lo, diff["lo"]) and shown_equals(hi, diff["hi"]), row


def _check_adversarial(table: Table, data: dict, args: dict[str, str]) -> None:
    """adversarial.py: one row a group of cases, in the script's order, then all of them: the
    cases, those as expected, and each outcome's count."""
    groups: dict[str, list[dict]] = {"all": []}
    for r in data["rows"]:
        groups.setdefault(r["group"], []).append(r)
        groups["all"].append(r)
    names = [*list(groups)[1:], "all"]
    assert [row[0].strip("*") for row in table.rows] == names
    for row in table.rows:
        rows = groups[row[0].strip("*")]
        count = [sum(r["outcome"] == o for r in rows) for o in ("one line", "ok")]
        broken = sum(r["outcome"] not in ("one line", "ok") for r in rows)
        shown = [int(c.strip("*").replace(",", "")) for c in row[1:]]
        assert shown == [len(rows), sum(r["as_expected"] for r in rows), *count, broken], row


def _check_serve_load(table: Table, data: dict, args: dict[str, str]) -> None:
    """serve_load.py: the service's rounds (clients, requests/s, p50 and p99 ms, mean batch, RSS),
    then the model loop's rows; a run that failed a check is not a result."""
    assert not data["failures"], data["failures"]
    expect = [[str(r["clients"]), r["per_second"], r["p50_ms"], r["p99_ms"], r["mean_batch"], r["rss_mb"]]
              for r in data["rounds"]]  # fmt: skip
    expect += [["-", r["per_second"], r["p50_ms"], r["p99_ms"]] for r in data["model_loop"]]
    assert len(table.rows) == len(expect)
    for row, values in zip(table.rows, expect):
        assert row[1] == values[0], row
        for cell, value in zip(row[2:], values[1:]):
            assert shown_equals(cell, value), (row, cell, value)


RULES = {
    "serve_load": _check_serve_load,
    "adversarial": _check_adversarial,
    "adapters": _check_adapters,
    "loop_overhead": _check_loop_overhead,
    "merge_curve": _check_merge_curve,
    "contention": _check_contention,
    "cpu_kind": _check_cpu_kind,
    "int8_accuracy": _check_int8_accuracy,
    "peers": _check_peers,
    "embed_speed": _check_embed_speed,
    "reproduce_budget": _check_reproduce_budget,
    "naflex_cost": _check_naflex_cost,
    "naflex_accuracy": _check_naflex_accuracy,
}


def _kind(data: dict) -> str:
    if "model_loop" in data and "rounds" in data:
        return "serve_load"
    if "counts" in data and "rows" in data:
        return "adversarial"
    if "speed" in data:
        return "adapters"
    if "loop_median" in data:
        return "loop_overhead"
    if "baseline_r" in data:
        return "merge_curve"
    if "rows" in data and data["rows"] and "share_kept" in str(data["rows"]):
        return "contention"
    if "meta" in data and "results" in data:
        return "cpu_kind"
    if "ckpt" in data and "rows" in data:
        return "int8_accuracy"
    if "suites" in data:
        return "peers"
    if "model" in data and "rows" in data and "images" in data:
        return "embed_speed"
    if "calls" in data and "kinds" in data:
        return "reproduce_budget"
    if "naflex_minus" in data:
        return "naflex_accuracy"
    if "per_token_ratio" in data:
        return "naflex_cost"
    raise AssertionError("no rule in tests/test_results.py for this kind of file")


@pytest.mark.parametrize("table", [t for t in TABLES if t.marker], ids=_id)
def test_marked_tables_match_their_json(table: Table):
    name, args = table.marker
    data = json.loads((RESULTS_DIR / name).read_text())
    torch_version = _torch_of(data)
    if torch_version:
        assert torch_version in table.run["torch"], f"the run line's torch is not the file's {torch_version}"
    RULES[_kind(data)](table, data, args)


def test_numbers_are_compared_to_the_digits_shown():
    assert shown_equals("3083", 3082.66)
    assert shown_equals("**93.24%**", 93.24)
    assert shown_equals("19.4", 19.369)
    assert not shown_equals("19.3", 19.369)
    assert not shown_equals("1,199", 1220.8)
    assert shown_equals("1,199", 1199.3)
