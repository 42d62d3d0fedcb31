"""Running a suite's training runs: skip the finished, resume the interrupted, score each once.

A run is finished when its folder holds ``result.json`` (written atomically, last). Until then
the folder is an ordinary vitkit run that :func:`vitkit.train.train` resumes bit for bit from its
last checkpoint, so a suite killed at any moment ends, on the next call, with the numbers an
uninterrupted one would have given.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...errors import TrainingError
from ...models.flops import resnet_flops, vit_flops
from ...models.registry import model_config
from .pool import PARALLEL, Processes, usable_cores
from .provenance import code_hash
from .results import load_result, nonfinite_fields, read_result
from .scoring import ScoreSettings, train_and_score
from .signals import Interrupted, stop_on_signals
from .spec import RunSpec, Suite


class Runner:
    """Runs specs (dependencies first), ``jobs`` at a time, reporting a line per run and an ETA.

    SIGINT (Ctrl-C) or SIGTERM stops it within seconds (:class:`Interrupted`): no queued run
    starts, the running ones stop where they are (their checkpoints resume them bit for bit on the
    next call) and every finished run's ``result.json`` is kept.

    A finished run is reused whatever code made it; the runs made by code other than this
    process's (:func:`.provenance.code_hash`) are said at the start, and the report names them.

    Args:
        suite: the shared settings of the call.
        jobs: the runs trained at once, at least 1.
        report: called with each line to say.
        call: the call's id, recorded by every run it trains (:func:`.provenance.new_call_id`).

    Raises:
        ValueError: ``jobs`` below 1.
    """

    def __init__(
        self, suite: Suite, jobs: int = 1, report: Callable[[str], None] = print, call: str | None = None
    ) -> None:
        if jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {jobs}")
        self.suite, self.jobs, self.report, self.call = suite, jobs, report, call
        self.settings = ScoreSettings.of(suite)
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, specs: list[RunSpec], later_cost: float = 0.0) -> dict[str, dict[str, Any]]:
        """Train and score the runs of ``specs`` that have no result yet.

        Args:
            specs: the runs, each once.
            later_cost: the :meth:`cost` of runs a later call of this method will train (the
                phases not yet planned), counted in the ETA.

        Returns:
            Every run's result by key, finished now or before.

        Raises:
            Interrupted: SIGINT or SIGTERM stopped the runs.
        """
        self._later_cost = max(0.0, later_cost)
        with stop_on_signals():
            try:
                return self._run(specs)
            except Interrupted as e:
                e.finished, e.total = self._finished(specs), len(specs)
                raise

    def _finished(self, specs: list[RunSpec]) -> int:
        """How many of ``specs`` have a result on disk (a run process may have written its result
        and been stopped before it said so)."""
        n = 0
        for spec in specs:
            with contextlib.suppress(OSError):
                n += read_result(self.suite.run_dir(spec) / "result.json") is not None
        return n

    def _run(self, specs: list[RunSpec]) -> dict[str, dict[str, Any]]:
        todo = []
        for spec in specs:
            path = self.suite.run_dir(spec) / "result.json"
            res, damaged = load_result(path)
            if res is not None:
                self.results[spec.key] = res
            else:
                if damaged:
                    self.report(
                        f"{path}: {damaged}; the run counts as not finished: it resumes from its checkpoints "
                        "and is scored again"
                    )
                todo.append(spec)
        if specs:
            self.report(f"{len(specs) - len(todo)} of {len(specs)} runs already finished; {len(todo)} to run")
        other = other_code([self.results[s.key] for s in specs if s.key in self.results])
        if other:
            self.report(f"of the finished runs, {other} (reused as they are; the report names them)")
        self._cost_done = self._seconds_done = 0.0
        self._total_cost = sum(self.cost(s) for s in todo)
        self._count, self._total = 0, len(todo)
        for phase in (
            [s for s in todo if s.after is None],
            [s for s in todo if s.after is not None],
        ):
            self._run_phase(phase)
        return self.results

    def train_flops(self, spec: RunSpec) -> float:
        """A run's training FLOPs as its result counts them (3 x forward FLOPs x images), before it runs.

        Args:
            spec: the run; its recipe's model, ``train.steps`` and ``train.batch_size`` are read
                (1 for a missing one).

        Returns:
            3 x the model's forward FLOPs per image x steps x batch size.
        """

        m, t = spec.recipe["model"], spec.recipe.get("train", {})
        over = {**m.get("overrides", {}), "in_chans": self.suite.info.in_chans,
                "num_classes": self.suite.info.num_classes}  # fmt: skip
        cfg = model_config(m["name"], **over)
        flops = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
        return 3.0 * float(flops) * int(t.get("steps", 1)) * int(t.get("batch_size", 1))

    def cost(self, spec: RunSpec) -> float:
        """Relative cost of a run, for the ETA.

        Args:
            spec: the run.

        Returns:
            Its model's forward FLOPs x the images it trains on, plus a constant for start-up and scoring.
        """

        m, t = spec.recipe["model"], spec.recipe.get("train", {})
        cfg = model_config(m["name"], **{**m.get("overrides", {}), "in_chans": self.suite.info.in_chans})
        flops = resnet_flops(cfg) if hasattr(cfg, "units") else vit_flops(cfg)
        return float(flops) * int(t.get("steps", 1)) * int(t.get("batch_size", 1)) + 1e9

    def longest_first(self, specs: list[RunSpec]) -> list[RunSpec]:
        """The order runs start in when several train at once: the costliest first (:meth:`cost`;
        equals keep their order), so that the phase does not end on one long run with the other
        cores idle.

        Args:
            specs: the runs of a phase.

        Returns:
            The same runs, costliest first.
        """
        return sorted(specs, key=lambda s: -self.cost(s))

    def _init_from(self, spec: RunSpec) -> str | None:
        if spec.after is None:
            return None
        return str((self.suite.out / "runs" / spec.after / "best.safetensors").resolve())

    def _run_phase(self, specs: list[RunSpec]) -> None:
        if not specs:
            return
        if self.jobs > 1 and not PARALLEL:
            self.report(f"--jobs {self.jobs}: runs go one at a time on this system (no process groups)")
            self.jobs = 1
        at_once = min(self.jobs, len(specs))  # what each result records beside its wall time
        args = [(s, self.suite.run_dir(s), self._init_from(s), self.settings, at_once, self.call) for s in specs]
        if self.jobs == 1:  # in this process: a signal interrupts the training where it is
            for a in args:
                start = time.perf_counter()
                self._done(a[0], train_and_score(*a), time.perf_counter() - start)
            return
        order = {s.key: i for i, s in enumerate(self.longest_first(specs))}
        queue = deque(sorted(args, key=lambda a: order[a[0].key]))
        threads = max(1, usable_cores() // self.jobs)
        with Processes(self.jobs, threads) as procs:
            while queue or procs.busy():
                while queue and procs.has_room():
                    procs.start(queue.popleft())
                for p, message in procs.wait():
                    job, p.job = p.job, None
                    assert job is not None
                    if message is None:
                        raise TrainingError(
                            f"{job[1]}: the run's process ended (exit code {p.proc.returncode}) before the run "
                            "finished; run the same command again to resume it"
                        )
                    kind, payload = message
                    if kind == "error":
                        raise payload
                    self._done(job[0], payload, (time.perf_counter() - p.started) / self.jobs)

    def _done(self, spec: RunSpec, res: dict[str, Any], seconds: float) -> None:
        self.results[spec.key] = res
        self._count += 1
        self._cost_done += self.cost(spec)
        self._seconds_done += seconds
        left = (self._total_cost + self._later_cost - self._cost_done) * self._seconds_done / max(self._cost_done, 1.0)
        fs = res["fewshot"]
        bad = nonfinite_fields(res)
        numbers = (
            f"diverged ({', '.join(bad)})"
            if bad
            else f"test top-1 {100 * res['test_top1']:.2f}%, {fs['shots']}-shot {100 * fs['mean']:.2f}%"
        )
        if (own := res.get("fewshot_in_domain")) and not bad:
            numbers += f", in-domain {own['shots']}-shot {100 * own['mean']:.2f}%"
        self.report(
            f"[{self._count}/{self._total}] {spec.label}: {numbers} ({res['wall_seconds']:.0f} s); "
            f"ETA {_duration(left)}"
        )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def other_code(results: list[dict[str, Any]]) -> str:
    """What of ``results`` was made by code other than this process's (:func:`code_hash`): the
    count by code version, and the runs that do not record theirs; empty where every run was made
    by this code.

    Args:
        results: finished runs' results.

    Returns:
        A phrase ("2 runs were made by code 3fa9c0d1e2b4, 1 run does not record its code, not by
        this code (5b7e...)"), or "".
    """
    here = code_hash()
    counts: dict[str, int] = {}
    for res in results:
        made = res.get("made_by")
        code = made.get("code") if isinstance(made, dict) else None
        if code != here:
            counts[code or ""] = counts.get(code or "", 0) + 1
    if not counts:
        return ""
    parts = [
        f"{n} run{'s were' if n != 1 else ' was'} made by code {code}" if code
        else f"{n} run{'s do' if n != 1 else ' does'} not record {'their' if n != 1 else 'its'} code"
        for code, n in sorted(counts.items(), key=lambda kv: (not kv[0], kv[0]))  # unrecorded last
    ]  # fmt: skip
    return f"{', '.join(parts)}, not by this code ({here})"
