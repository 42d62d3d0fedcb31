"""vitkit against timm, Hugging Face transformers and torchvision, in one run.

Contenders are interleaved (A B C A B C ...) over several rounds and each gets, after one untimed
iteration, the median of its timed iterations per round, then the median over rounds: load on a
shared machine hits them all alike, and the ratios are what to read. Same shapes, same weights
count, same precision; each peer also runs in its own best mode (bf16 weights, its fused
attention, torch.compile on request).
Peers that are not installed are skipped and listed. vitkit serves through
``vitkit.inference.prepare_inference`` (oneDNN-packed layers); the peers run their own modules.
The rows "timm+vitkit-serving" give timm's model vitkit's serving path, to show how much of the
inference lead is that path: they are reference rows, not peers (they get the packed layers, not
the GELU fusion, which is for vitkit's MLP). In int8, vitkit runs everything but the linear layers
in bf16; timm's `quantize_dynamic` runs it in fp32.

The inference runtimes (OpenVINO, ONNX Runtime; where installed, else skipped and named) run
vitkit's own ONNX export of the same weights with torch's thread count; each row of theirs says
how far its logits are from fp32 eager (largest difference, smallest cosine of an image's logits).
Their static int8 is calibrated on ``--calib`` random images; vitkit's int8 on the timed batch.
The rows "vitkit-auto" are what the commands serve by default (``--backend auto``): vitkit's own
path or the runtime that ``vitkit.backends`` measured fastest at the suite's batch, its choice named.

    python benchmarks/peers.py                      # all suites
    python benchmarks/peers.py --suite infer_b16    # one suite
    python benchmarks/peers.py --suite infer_fmnist --rounds 1 --iters 1 --warmup 1 --calib 16   # seconds
    python benchmarks/peers.py --json benchmarks/out/peers.json
    python benchmarks/peers.py --suite train_fmnist --contended   # beside a competing CPU-bound process

timm and torchvision need a torchvision build (here: torch 2.14.1 + torchvision 0.29.1, a CUDA
build of several GB); transformers installs beside vitkit's torch. See benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import vitkit
from vitkit.bench import make_step as bench_step
from vitkit.bench import matmul_ceiling
from vitkit.cpu import cpu_info
from vitkit.models.flops import model_flops
from vitkit.precision import resolve_precision
from vitkit.train.allocator import keep_freed_memory

# ---------------------------------------------------------------------------------------------
# Model builders: name -> (peer, architecture) -> nn.Module taking NCHW floats, giving logits.

ARCHS = {
    # name: (img, patch, in_chans, width, depth, heads, mlp, classes)
    "b16": (224, 16, 3, 768, 12, 12, 3072, 1000),
    "s16": (224, 16, 3, 384, 12, 6, 1536, 1000),
    "l16": (224, 16, 3, 1024, 24, 16, 4096, 1000),
    "fmnist": (28, 4, 1, 192, 6, 3, 768, 10),
}


def build_vitkit(arch: str) -> nn.Module:
    img, patch, c, w, d, h, m, k = ARCHS[arch]
    return vitkit.create_model(
        "vit_b16",
        img_size=img,
        patch_size=patch,
        in_chans=c,
        width=w,
        depth=d,
        num_heads=h,
        mlp_dim=m,
        num_classes=k,
        act="gelu",
    )


def build_timm(arch: str) -> nn.Module:
    import timm

    img, patch, c, w, d, h, m, k = ARCHS[arch]
    return timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=img,
        patch_size=patch,
        in_chans=c,
        embed_dim=w,
        depth=d,
        num_heads=h,
        mlp_ratio=m / w,
        num_classes=k,
    )


def build_hf(arch: str, attn: str) -> nn.Module:
    import transformers

    img, patch, c, w, d, h, m, k = ARCHS[arch]
    cfg = transformers.ViTConfig(
        hidden_size=w,
        num_hidden_layers=d,
        num_attention_heads=h,
        intermediate_size=m,
        image_size=img,
        patch_size=patch,
        num_channels=c,
        num_labels=k,
        attn_implementation=attn,
    )
    model = transformers.ViTForImageClassification(cfg)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(pixel_values=x).logits

    return Logits()


def build_torchvision(arch: str) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    img, patch, c, w, d, h, m, k = ARCHS[arch]
    if c != 3:
        raise RuntimeError("torchvision's ViT takes 3 channels only")
    return VisionTransformer(
        image_size=img, patch_size=patch, num_layers=d, num_heads=h, hidden_dim=w, mlp_dim=m, num_classes=k
    )


PEERS: dict[str, Callable[[str], nn.Module]] = {
    "vitkit": build_vitkit,
    "timm": build_timm,
    "hf-sdpa": lambda a: build_hf(a, "sdpa"),
    "hf-eager": lambda a: build_hf(a, "eager"),
    "torchvision": build_torchvision,
    # timm's model served through vitkit.inference.prepare_inference: not a peer's own mode, a
    # reference row that shows how much of vitkit's inference lead is its serving path
    "timm+vitkit-serving": build_timm,
}


# ---------------------------------------------------------------------------------------------
# The inference runtimes a user who wants speed on a CPU would pick, fed from vitkit's own ONNX
# export (vitkit.export.export_onnx) of the same weights: OpenVINO (fp32; bf16 where vitkit's
# precision policy finds it native; int8 by NNCF's post-training quantisation, transformer mode:
# SmoothQuant) and ONNX Runtime (fp32 after its transformer optimiser; dynamic int8; static QDQ
# int8). Each runs with torch's thread count; its outputs are checked against fp32 eager.

RUNTIME_PEERS = {"openvino": "openvino", "onnxruntime": "onnxruntime", "onnxruntime-qdq": "onnxruntime"}


def _runtime_model(arch: str) -> nn.Module:
    """vitkit's model of the suite, with a random head: vitkit initialises the head to zeros, and
    all-zero logits would make any runtime agree with fp32 eager."""
    model = build_vitkit(arch).eval()
    with torch.no_grad():
        model.head.weight.normal_(std=0.02)
    return model


def _exported(arch: str, folder: Path) -> Path:
    """The suite's model as vitkit exports it to ONNX (once per suite)."""
    from vitkit.export import export_onnx

    path = folder / f"{arch}.onnx"
    if not path.exists():
        torch.manual_seed(0)
        export_onnx(_runtime_model(arch), path, check=False)
    return path


def _ort_static_qdq(path: Path, calibration: torch.Tensor) -> Callable:
    """ONNX Runtime's static int8 in QDQ form for the products (MatMul, Gemm: weights per channel,
    activations calibrated on ``calibration`` by min-max); the rest stays fp32."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"pixels": b.numpy()} for b in calibration.split(8)])

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    from vitkit.backends import cpu_saturates_int8_pairs

    out = path.with_name(path.stem + f"-qdq-int8{'-7bit' if cpu_saturates_int8_pairs() else ''}.onnx")
    if not out.exists():
        quantize_static(
            str(path), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"],
            reduce_range=cpu_saturates_int8_pairs(),  # 7-bit weights where 16-bit pair sums saturate (no VNNI)
        )  # fmt: skip
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"pixels": x})


def runtime_step(peer: str, arch: str, precision: str, batch: int, folder: Path, calib: int) -> tuple[Callable, dict]:
    """The timed step of a runtime contender and its outputs' agreement with fp32 eager on the
    step's batch (max abs difference and the smallest cosine of an image's logits)."""
    from vitkit.backends import agreement, onnxruntime_session, openvino_session

    img, _, c, *_rest = ARCHS[arch]
    __import__(RUNTIME_PEERS[peer])  # missing: the contender is skipped, named
    path = _exported(arch, folder)
    calibration = torch.randn(calib, c, img, img, generator=torch.Generator().manual_seed(1))
    if peer == "openvino":
        run = openvino_session(path, precision, calibration.numpy() if precision == "int8" else None)
    elif peer == "onnxruntime-qdq":
        if precision != "int8":
            raise ValueError("the QDQ contender is static int8 only")
        run = _ort_static_qdq(path, calibration)
    else:
        run = onnxruntime_session(path, precision)
    x = torch.randn(batch, c, img, img, generator=torch.Generator().manual_seed(2)).numpy()
    torch.manual_seed(0)
    with torch.no_grad():
        want = _runtime_model(arch)(torch.from_numpy(x)).numpy()
    check = agreement(run(x)[0], want, precision)  # the export's first (only) output: the logits
    return (lambda: run(x)), check


def auto_step(arch: str, precision: str, batch: int, folder: Path, calib: int) -> tuple[Callable, dict]:
    """What the commands serve by default (``--backend auto``): ``vitkit.backends.serving_backend``
    measures vitkit's own path and each installed runtime at the suite's batch (measured now, in a
    cache of the benchmark's own) and the step computes the logits through whichever it chose.
    Returns the step and what was chosen (``choice``, the decision's images a second)."""
    from vitkit.backends import serving_backend
    from vitkit.inference import prepare_inference

    img, _, c, *_rest = ARCHS[arch]
    calibration = torch.randn(calib, c, img, img, generator=torch.Generator().manual_seed(1))
    calibration = calibration if precision == "int8" else None
    os.environ["VITKIT_CACHE"] = str(folder / "auto-cache")  # a fresh decision, not one recorded earlier
    torch.manual_seed(0)
    model = _runtime_model(arch)
    runner, decision = serving_backend(model, "auto", precision, calibration=calibration, batch=batch)
    x = torch.randn(batch, c, img, img, generator=torch.Generator().manual_seed(2))
    if runner is None:
        runner = prepare_inference(model, precision, calibration=calibration)
        x = x.to(runner.input_dtype)

    def step() -> None:
        with torch.inference_mode():
            runner(x)

    return step, {"choice": decision.backend, "decision_images_per_s": decision.images_per_s, "batch": decision.batch}


# ---------------------------------------------------------------------------------------------


@dataclass
class Contender:
    peer: str
    precision: str  # fp32 | bf16 (inference: bf16 weights; training: autocast) | int8 (inference)
    compile: bool = False
    times: list[float] = field(default_factory=list)
    step: Callable[[], None] | None = None
    error: str | None = None
    setup_s: float | None = None  # building, warm-up and compiling
    peak_mb: float | None = None  # GPU only: peak allocated during warm-up, above what was there
    check: dict | None = None  # runtimes: outputs against fp32 eager (max_abs_diff, min_cosine, within)
    auto: dict | None = None  # vitkit-auto: what it chose and the images a second behind the choice

    @property
    def label(self) -> str:
        return f"{self.peer} {self.precision}{' compile' if self.compile else ''}"


def uses_vitkit_serving(peer: str) -> bool:
    return peer in ("vitkit", "vitkit-auto") or peer.endswith("+vitkit-serving")


def make_step(
    model: nn.Module,
    arch: str,
    mode: str,
    precision: str,
    batch: int,
    compile: bool,
    peer: str = "vitkit",
    device: str = "cpu",
) -> Callable[[], None]:
    """Inference: vitkit's serving path (oneDNN-packed layers on a CPU) for vitkit; the peers' own
    modules (bf16 weights, or torch.ao dynamic int8) for the peers. On a GPU everyone runs their
    own module (bf16 weights for inference, autocast and fused AdamW for training)."""
    img, _, c, *_rest, k = ARCHS[arch]
    x = torch.randn(batch, c, img, img, device=device)
    y = torch.randint(0, k, (batch,), device=device)
    model = model.to(device)
    pack = None if uses_vitkit_serving(peer) and device == "cpu" else False
    return bench_step(model, x, y, mode, precision, compile, pack=pack)


SUITES = {
    # name: (arch, mode, batch, [(peer, precision, compile), ...])
    "infer_b16": (
        "b16",
        "infer",
        8,
        [
            ("vitkit", "fp32", False),
            ("vitkit-auto", "fp32", False),
            ("timm", "fp32", False),
            ("hf-sdpa", "fp32", False),
            ("torchvision", "fp32", False),
            ("vitkit", "bf16", False),
            ("vitkit-auto", "bf16", False),
            ("timm", "bf16", False),
            ("hf-sdpa", "bf16", False),
            ("hf-eager", "bf16", False),
            ("torchvision", "bf16", False),
            ("vitkit", "int8", False),
            ("vitkit-auto", "int8", False),
            ("timm", "int8", False),
            ("timm+vitkit-serving", "fp32", False),
            ("timm+vitkit-serving", "bf16", False),
            ("timm+vitkit-serving", "int8", False),
            ("openvino", "fp32", False),
            ("openvino", "bf16", False),
            ("openvino", "int8", False),
            ("onnxruntime", "fp32", False),
            ("onnxruntime", "int8", False),
            ("onnxruntime-qdq", "int8", False),
        ],
    ),
    # vitkit against the inference runtimes alone, on the demo model's shape: seconds, not minutes
    "infer_fmnist": (
        "fmnist",
        "infer",
        64,
        [
            ("vitkit", "fp32", False),
            ("vitkit-auto", "fp32", False),
            ("openvino", "fp32", False),
            ("onnxruntime", "fp32", False),
            ("vitkit", "bf16", False),
            ("vitkit-auto", "bf16", False),
            ("openvino", "bf16", False),
            ("vitkit", "int8", False),
            ("vitkit-auto", "int8", False),
            ("openvino", "int8", False),
            ("onnxruntime", "int8", False),
            ("onnxruntime-qdq", "int8", False),
        ],
    ),
    "infer_b16_bs1": (
        "b16",
        "infer",
        1,
        [("vitkit", "fp32", False), ("timm", "fp32", False), ("vitkit", "bf16", False), ("timm", "bf16", False)],
    ),
    "train_fmnist": (
        "fmnist",
        "train",
        128,
        [
            ("vitkit", "fp32", False),
            ("timm", "fp32", False),
            ("vitkit", "bf16", False),
            ("timm", "bf16", False),
            ("hf-sdpa", "bf16", False),
            ("hf-eager", "bf16", False),
        ],
    ),
    "train_s16": (
        "s16",
        "train",
        16,
        [
            ("vitkit", "fp32", False),
            ("timm", "fp32", False),
            ("vitkit", "bf16", False),
            ("timm", "bf16", False),
            ("hf-sdpa", "bf16", False),
        ],
    ),
}

# On a GPU: the issue's ViT-B/16 and L/16 in bf16, at batches that fill an H200-class card.
GPU_PEERS = ["vitkit", "timm", "hf-sdpa", "torchvision"]
GPU_SUITES = {
    "gpu_infer_b16": ("b16", "infer", 256, [(p, "bf16", False) for p in GPU_PEERS]),
    "gpu_train_b16": ("b16", "train", 128, [(p, "bf16", False) for p in GPU_PEERS]),
    "gpu_infer_l16": ("l16", "infer", 128, [(p, "bf16", False) for p in GPU_PEERS]),
    "gpu_train_l16": ("l16", "train", 64, [(p, "bf16", False) for p in GPU_PEERS]),
}
SUITES.update(GPU_SUITES)


def _sync(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def run_suite(
    name: str,
    rounds: int,
    iters: int,
    warmup: int,
    compile_too: bool,
    device: str = "cpu",
    precisions: tuple[str, ...] | None = None,
    calib: int = 64,
) -> dict:
    arch, mode, batch, spec = SUITES[name]
    scratch = tempfile.TemporaryDirectory(prefix="vitkit-peers-")  # the runtimes' exported files
    if precisions is not None:
        spec = [c for c in spec if c[1] in precisions]
    if compile_too:
        spec = spec + [(p, prec, True) for p, prec, c in spec if p in ("vitkit", "timm")]
    contenders = [Contender(p, prec, c) for p, prec, c in spec]
    flops = model_flops(build_vitkit(arch)) * (3 if mode == "train" else 1)
    for ct in contenders:
        try:
            torch.manual_seed(0)
            if device != "cpu":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t = time.perf_counter()
            if ct.peer == "vitkit-auto":
                if device != "cpu" or ct.compile:
                    raise RuntimeError("auto chooses among CPU paths, uncompiled")
                ct.step, ct.auto = auto_step(arch, ct.precision, batch, Path(scratch.name), calib)
            elif ct.peer in RUNTIME_PEERS:
                if device != "cpu" or ct.compile:
                    raise RuntimeError("the runtimes run on the CPU, uncompiled")
                ct.step, ct.check = runtime_step(ct.peer, arch, ct.precision, batch, Path(scratch.name), calib)
            else:
                model = PEERS[ct.peer](arch)
                ct.step = make_step(model, arch, mode, ct.precision, batch, ct.compile, ct.peer, device)
            for _ in range(warmup):
                ct.step()
            _sync(device)
            ct.setup_s = time.perf_counter() - t  # includes torch.compile's compile time
            if device != "cpu":
                ct.peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        except Exception as e:  # a peer that is missing or cannot run this mode is reported, not fatal
            ct.error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}" if str(e) else type(e).__name__
            ct.step = None
    precisions = sorted({ct.precision for ct in contenders})
    ceilings = dict.fromkeys(precisions, 0.0)
    for _ in range(rounds):
        for ct in contenders:  # interleaved
            if ct.step is None:
                continue
            ct.step()  # untimed: the ceiling's large matrices (or the previous contender) have just left the caches
            _sync(device)
            ts = []
            for _ in range(iters):
                t = time.perf_counter()
                ct.step()
                _sync(device)
                ts.append(time.perf_counter() - t)
            ct.times.append(statistics.median(ts))
        # The ceiling is sampled in every round, between the contenders, and its best kept: one
        # measurement at a slow moment of a shared machine would flatter every fraction.
        for p in precisions:
            ceilings[p] = max(ceilings[p], matmul_ceiling(p, device))
    rows = []
    for ct in contenders:
        if ct.step is None:
            rows.append({"contender": ct.label, "error": ct.error})
            continue
        med = statistics.median(ct.times)
        ips = batch / med
        ceiling = ceilings[ct.precision]
        rows.append(
            {
                "contender": ct.label,
                "peer": ct.peer,
                "precision": ct.precision,
                "compile": ct.compile,
                "images_per_s": ips,
                "achieved_gflops": flops * ips / 1e9,
                "fraction_of_ceiling": flops * ips / 1e9 / ceiling,
                "round_medians_s": ct.times,
                "setup_s": ct.setup_s,
                "peak_memory_mb": ct.peak_mb,
                "vs_fp32_eager": ct.check,
                "auto": ct.auto,
            }
        )
    scratch.cleanup()
    return {
        "suite": name,
        "arch": arch,
        "mode": mode,
        "batch": batch,
        "device": device,
        "rows": rows,
        "ceilings": ceilings,
    }


def _agreement_text(check: dict | None) -> str:
    if not check:
        return ""
    off = "" if check["within"] else "  OUTSIDE TOLERANCE"
    return f"   vs fp32 eager: max diff {check['max_abs_diff']:.1e}, cosine {check['min_cosine']:.5f}{off}"


def print_suite(res: dict) -> None:
    print(f"\n== {res['suite']}: {res['arch']} {res['mode']} batch {res['batch']} ==")
    ok = [r for r in res["rows"] if "images_per_s" in r]
    peers = [r for r in ok if not uses_vitkit_serving(r["peer"])]
    best_peer = {
        prec: max((r["images_per_s"] for r in peers if r["precision"] == prec), default=None)
        for prec in ("fp32", "bf16", "int8")
    }
    best_peer_any = max((r["images_per_s"] for r in peers), default=None)
    gpu = res.get("device", "cpu") != "cpu"
    mem = f" {'peak MB':>9}" if gpu else ""
    print(f"{'contender':<32} {'img/s':>9} {'% ceiling':>10} {'vs best peer, same precision':>30}{mem}")
    for r in res["rows"]:
        if "error" in r:
            print(f"{r['contender']:<32} {'skipped':>9}  ({r['error']})")
            continue
        ref = best_peer.get(r["precision"])
        ratio = f"{r['images_per_s'] / ref:.2f}x" if ref and uses_vitkit_serving(r["peer"]) else ""
        mem = f" {r['peak_memory_mb']:9.0f}" if gpu and r.get("peak_memory_mb") is not None else ""
        line = f"{r['contender']:<32} {r['images_per_s']:9.2f} {100 * r['fraction_of_ceiling']:9.0f}% {ratio:>30}"
        chose = f"   chose {r['auto']['choice']}" if r.get("auto") else ""
        print(line + mem + _agreement_text(r.get("vs_fp32_eager")) + chose)
    ceilings = ", ".join(f"{p} {c:.0f}" for p, c in res["ceilings"].items())
    print(f"matmul ceilings (GFLOP/s; int8 GOP/s), best of the rounds: {ceilings}")
    vk = max((r["images_per_s"] for r in ok if r["peer"] == "vitkit"), default=None)
    if vk and best_peer_any:
        print(f"best vitkit mode vs best peer mode: {vk / best_peer_any:.2f}x")
    res["best_vitkit_vs_best_peer"] = vk / best_peer_any if vk and best_peer_any else None


# transformers imports lazily: name the ViT module itself
PEER_MODULES = ("timm", "transformers.models.vit.modeling_vit", "torchvision.models.vision_transformer")


def train_peak_memory(peer: str, arch: str, batch: int, precision: str) -> float | None:
    """Peak resident memory (MB) of building the model and three training steps, each peer in a
    fresh process. Every process imports all the installed peer libraries first and takes its
    baseline after that: the heap a library's import leaves behind is reused by later allocations,
    so a baseline taken after different imports (or after the model is built) would measure the
    imports, not the training step."""
    code = (
        "import sys,importlib,torch;sys.path.insert(0,'benchmarks');import peers as P;"
        "from vitkit.bench import peak_rss_kb;from vitkit.train.allocator import keep_freed_memory\n"
        "keep_freed_memory()\n"
        "for m in P.PEER_MODULES:\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception: pass\n"
        "b=peak_rss_kb();torch.manual_seed(0)\n"
        f"s=P.make_step(P.PEERS[{peer!r}]({arch!r}),{arch!r},'train',{precision!r},{batch},False)\n"
        "[s() for _ in range(3)];print((peak_rss_kb()-b)/1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    try:
        return float(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also run vitkit and timm under torch.compile")
    ap.add_argument("--memory", action="store_true", help="peak memory of a ViT-B/16 training step per peer")
    ap.add_argument("--json", default="benchmarks/out/peers.json")
    ap.add_argument("--calib", type=int, default=64, help="random images that calibrate the runtimes' static int8")
    ap.add_argument(
        "--precisions",
        default="auto",
        help="comma-separated contenders' precisions to run (fp32,bf16,int8); auto: all of them, but "
        "bf16 only where this device computes it natively (vitkit.precision)",
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default suites: gpu_* on cuda, the rest on cpu)")
    ap.add_argument(
        "--contended",
        action="store_true",
        help="run a competing CPU-bound process (2048x2048 fp32 matmuls, torch's default threads) throughout",
    )
    args = ap.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available here")
    if args.device != "cpu" and args.memory:
        ap.error("--memory measures CPU peak memory; on a GPU each suite reports its peak allocated memory")
    torch.set_flush_denormal(True)
    # The allocator setting vitkit's trainer makes is a property of the process, not of a model:
    # every contender runs under it (vitkit/train/allocator.py), here and in the memory runs.
    kept = keep_freed_memory()
    cpu = cpu_info()
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": cpu["model"],
        "cpu": cpu,
        "contended": args.contended,
        "command": " ".join(sys.argv),
        "device": args.device,
        "keep_freed_memory": kept,
    }
    if args.device != "cpu":
        info["gpu"] = torch.cuda.get_device_name()
    for mod in ("timm", "transformers", "torchvision", "openvino", "onnxruntime", "nncf"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    if args.precisions == "auto":
        native = resolve_precision("auto", torch.device(args.device)).name == "bf16"
        args.precisions = "fp32,bf16,int8" if native else "fp32,int8"
        if not native:
            print("bf16 contenders left out: bf16 is emulated on this CPU (--precisions fp32,bf16,int8 runs them)")
    info["precisions"] = args.precisions
    print(json.dumps(info))
    rival = _competitor() if args.contended else None
    try:
        results, memory = _run(args)
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"info": info, "suites": results, "train_peak_memory_mb": memory}, indent=2))
    print(f"\nwrote {out}")


# What a second benchmark on the same machine does: large matmuls on every core, torch's defaults.
_COMPETITOR = """
import torch
a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
print("ready", flush=True)
while True:
    a @ b
"""


def _competitor() -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.Popen([sys.executable, "-c", _COMPETITOR], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _run(args: argparse.Namespace) -> tuple[list[dict], dict]:
    results = []
    default = [n for n in SUITES if (n in GPU_SUITES) == (args.device != "cpu")]
    for name in args.suite or default:
        precisions = tuple(args.precisions.split(","))
        res = run_suite(name, args.rounds, args.iters, args.warmup, args.compile, args.device, precisions, args.calib)
        print_suite(res)
        results.append(res)
    memory = {}
    if args.memory:
        print("\n== peak memory of building a ViT-B/16 and 3 training steps (batch 8, bf16 autocast), MB ==")
        for peer in ("vitkit", "timm", "hf-sdpa", "torchvision"):
            memory[peer] = train_peak_memory(peer, "b16", 8, "bf16")
            print(f"{peer:<14} {memory[peer] if memory[peer] is not None else 'skipped'}")
    return results, memory


if __name__ == "__main__":
    main()
