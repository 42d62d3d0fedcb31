"""The server's counters and histograms, written in Prometheus's text format (version 0.0.4).

Updated from the event loop and from the batching thread alike, so every change holds one lock.
Only the few metric kinds the server needs: counters with labels, one gauge, histograms with
fixed buckets.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    """Cumulative-bucket histogram: how many observations fell at or below each bound.

    Args:
        bounds: the upper bounds of the buckets, increasing (``+Inf`` is added).
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        """Count one observation.

        Args:
            value: the observed value.
        """
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """The histogram's sample lines.

        Args:
            name: the metric's name.
            labels: other labels, rendered (``endpoint="predict"``), or "".

        Returns:
            ``name_bucket`` lines (cumulative, ``+Inf`` last), ``name_sum`` and ``name_count``.
        """
        sep = "," if labels else ""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {running}')
        braces = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{braces} {self.total:.6g}", f"{name}_count{braces} {self.n}"]
        return out


class Metrics:
    """What ``GET /metrics`` reports: requests by endpoint and status, errors, batch sizes,
    request latency, the time each batch computed, and the queue's depth.

    Args:
        max_batch: the largest batch (the batch-size buckets go up to it).
        info: constant labels of ``vitkit_serve_info`` (model, precision, device...).
    """

    def __init__(self, max_batch: int, info: dict[str, str]) -> None:
        self._lock = threading.Lock()
        self.info = dict(info)
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        sizes, b = [], 1
        while b < max_batch:
            sizes.append(b)
            b *= 2
        self.batch_size = Histogram([*sizes, max_batch])
        self.batch_seconds = Histogram(LATENCY_BUCKETS)
        self.queue_depth = 0

    def request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count one answered request.

        Args:
            endpoint: "predict", "embed", "health" or "metrics".
            status: the HTTP status answered.
            seconds: from the request's arrival to its answer.
        """
        with self._lock:
            self.requests[endpoint, status] += 1
            self.latency.setdefault(endpoint, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, size: int, seconds: float) -> None:
        """Count one batch the model computed.

        Args:
            size: its images.
            seconds: the time the model took on it.
        """
        with self._lock:
            self.batch_size.observe(size)
            self.batch_seconds.observe(seconds)

    def set_queue_depth(self, depth: int) -> None:
        """Record how many images wait for the model.

        Args:
            depth: the queue's length now.
        """
        with self._lock:
            self.queue_depth = depth

    def render(self) -> str:
        """Everything, in Prometheus's text format.

        Returns:
            The text, ending in a newline.
        """
        with self._lock:
            info = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(self.info.items()))
            out = ["# HELP vitkit_serve_info The model served.", "# TYPE vitkit_serve_info gauge"]
            out.append(f"vitkit_serve_info{{{info}}} 1")
            out += ["# HELP vitkit_requests_total Requests answered.", "# TYPE vitkit_requests_total counter"]
            for (endpoint, status), n in sorted(self.requests.items()):
                out.append(f'vitkit_requests_total{{endpoint="{endpoint}",code="{status}"}} {n}')
            out += ["# HELP vitkit_errors_total Requests answered 4xx or 5xx.", "# TYPE vitkit_errors_total counter"]
            errors: dict[str, int] = defaultdict(int)
            for (endpoint, status), n in self.requests.items():
                errors[endpoint] += n if status >= 400 else 0
            out += [f'vitkit_errors_total{{endpoint="{e}"}} {n}' for e, n in sorted(errors.items())]
            out += ["# HELP vitkit_request_seconds Request latency.", "# TYPE vitkit_request_seconds histogram"]
            for endpoint, hist in sorted(self.latency.items()):
                out += hist.lines("vitkit_request_seconds", f'endpoint="{endpoint}"')
            out += ["# HELP vitkit_batch_size Images per model call.", "# TYPE vitkit_batch_size histogram"]
            out += self.batch_size.lines("vitkit_batch_size")
            out += ["# HELP vitkit_batch_seconds Model time per batch.", "# TYPE vitkit_batch_seconds histogram"]
            out += self.batch_seconds.lines("vitkit_batch_seconds")
            out += ["# HELP vitkit_queue_depth Images waiting for the model.", "# TYPE vitkit_queue_depth gauge"]
            out.append(f"vitkit_queue_depth {self.queue_depth}")
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
