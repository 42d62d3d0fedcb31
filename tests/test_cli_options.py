"""Issue #14, validation at the door: every option of every command is checked when the command
line is read (argparse types in ``vitkit.cli.common``), and a value that parses but does not fit
the model (a size off the patch grid, a grid too large to build, a layer the model lacks) is one
line from the library. No traceback, no hang, no late failure."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import vitkit
from vitkit.cli import COMMANDS, build_parser, main
from vitkit.cli import common as C

TINY = dict(img_size=16, patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)

# Options that may stay plain int/float: train's and finetune's flags are recipe keys, checked by
# the recipe's one mechanism (``checked(...)`` in vitkit.train.config), which names the key.
RECIPE_FLAGS = {"--steps", "--batch-size", "--accum-steps", "--eval-every", "--checkpoint-every", "--log-every"}
RECIPE_FLAGS |= {"--seed", "--lr"}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def numeric_options() -> list[tuple[str, str, argparse.Action]]:
    return [
        (cmd, a.option_strings[-1], a)
        for cmd, p in subparsers().items()
        for a in p._actions
        if a.option_strings and a.type is not None and a.option_strings[-1] not in RECIPE_FLAGS
    ]


def test_every_numeric_option_has_a_checked_type():
    """A bare ``type=int`` lets 0, -1 or 10**12 through to the command; every option uses one of
    the checked types (or is a recipe key, checked by the recipe)."""
    checked = {"count", "count_or_auto", "index", "number", "parse_size", "parse_device"}
    bare = [
        f"{cmd} {a.option_strings[-1]}"
        for cmd, p in subparsers().items()
        for a in p._actions
        if a.option_strings and a.type in (int, float) and a.option_strings[-1] not in RECIPE_FLAGS
    ]
    assert not bare, bare
    names = {getattr(a.type, "__name__", "") for _, _, a in numeric_options()}
    assert names <= checked, names - checked
    assert set(COMMANDS) == set(subparsers())


def test_the_types_know_their_edges():
    assert C.count(0)("0") == 0 and C.count(1)("7") == 7
    assert C.count_or_auto(1)("auto") == "auto" and C.count_or_auto(1)("3") == 3
    assert C.real(0)("0") == 0.0 and C.real(above=0)("1e-9") == 1e-9
    assert C.parse_size("384x512") == (384, 512) and C.parse_size("7") == 7
    assert C.parse_device("cpu") == "cpu"
    for parse, text in [
        (C.count(1), "0"),
        (C.count(0), "-1"),
        (C.count(1), "1.5"),
        (C.count_or_auto(1), "0"),
        (C.count_or_auto(1), "Auto"),
        (C.count_or_auto(1, 8), "9"),
        (C.real(0), "nan"),
        (C.real(0), "inf"),
        (C.real(0), "-1e-9"),
        (C.real(above=0), "0"),
        (C.parse_size, "0"),
        (C.parse_size, "16x-1"),
        (C.parse_size, "16x16x3"),
        (C.parse_device, "tpu"),
        (C.parse_device, "cuda:99"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def _positionals(cmd: str) -> list[str]:
    return {
        "eval": ["w", "--data", "synthetic"],
        "fewshot": ["w", "--data", "synthetic"],
        "probe": ["w", "--data", "synthetic"],
        "predict": ["w", "img.png"],
        "analyze": ["w", "--out", "o"],
        "convert": ["w", "o.safetensors"],
        "train": ["--out", "o"],
        "finetune": ["--out", "o", "--from", "w"],
        "reproduce": ["--out", "o"],
        "embed": ["w", "folder", "--out", "o.safetensors"],
        "view": ["w", "img.png", "--out", "o.html"],
    }.get(cmd, [])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    option=st.sampled_from(numeric_options()),
    text=st.one_of(
        st.integers(-(10**12), 10**12).map(str),
        st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False).map(repr),  # training flushes denormals
        st.sampled_from(["0", "-1", "1", "8x8", "0x8", "nan", "inf", "-inf", "", "1e400", "cuda", "cpu", "x"]),
        st.text(max_size=8),
    ),
)
def test_any_value_of_any_option_parses_within_bounds_or_is_refused_by_argparse(option, text):
    cmd, flag, action = option
    parser = build_parser()
    argv = [cmd, *_positionals(cmd), f"{flag}={text}"]
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 2
        return
    value = getattr(args, action.dest)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, tuple):
            assert min(v) >= 1
        elif isinstance(v, int):
            assert (v >= 0 or action.type.__name__ == "index") and v == int(text)
        elif isinstance(v, float):
            assert math.isfinite(v) and v >= 0
        else:
            assert v in ("cpu", "cuda") or str(v).startswith("cuda:")


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    vitkit.save_checkpoint(vitkit.create_model("vit_s16", **TINY), tmp_path / "w.safetensors")
    Image.fromarray((torch.rand(16, 16, 3) * 255).to(torch.uint8).numpy()).save(tmp_path / "img.png")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("predict w.safetensors img.png --top-k 0", "argument --top-k: must be at least 1, got 0"),
        ("predict w.safetensors img.png --device tpu", "argument --device: expected cpu, cuda or cuda:N"),
        ("eval w.safetensors --data synthetic --batch-size -1", "argument --batch-size: must be at least 1"),
        ("eval w.safetensors --data synthetic --max-images 0", "argument --max-images: must be at least 1"),
        ("eval w.safetensors --data synthetic --img-size 0x16", "argument --img-size: sides must be positive"),
        ("fewshot w.safetensors --data synthetic --shots 5 0", "argument --shots: must be at least 1, got 0"),
        ("fewshot w.safetensors --data synthetic --l2 inf", "argument --l2: must be finite"),
        ("probe w.safetensors --data synthetic --weight-decay -1", "argument --weight-decay: must be at least 0"),
        ("probe w.safetensors --data synthetic --temperature 0", "argument --temperature: must be greater than 0"),
        ("probe w.safetensors --data synthetic --max-iter 0", "argument --max-iter: must be at least 1"),
        ("analyze w.safetensors --out o --components 0", "argument --components: must be at least 1"),
        ("analyze w.safetensors --out o --layers x", "argument --layers: expected a whole number"),
        ("convert w.safetensors o.safetensors --num-classes -1", "argument --num-classes: must be at least 0"),
        ("bench --model vit_ti16 --batch 0", "argument --batch: must be at least 1"),
        ("bench --model vit_ti16 --iters 0", "argument --iters: must be at least 1"),
        ("bench --model vit_ti16 --warmup -1", "argument --warmup: must be at least 0"),
        ("models vit_ti16 --num-classes -3", "argument --num-classes: must be at least 0"),
        ("reproduce --out o --jobs 0", "argument --jobs: must be at least 1"),
        ("finetune --from w.safetensors --out o --img-size -16", "argument --img-size: must be at least 1"),
    ],
)
def test_a_bad_option_is_one_line_when_the_command_line_is_read(files, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv.split())
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("eval w.safetensors --data synthetic --img-size 18", "not divisible by the patch size 4x4"),
        ("eval w.safetensors --data synthetic --img-size 100000", "more than the 65536 tokens vitkit builds"),
        ("convert w.safetensors o.safetensors --img-size 4000x9000", "more than the 65536 tokens vitkit builds"),
        ("models vit_ti16 --img-size 100000", "more than the 65536 tokens vitkit builds"),
        ("bench --model vit_ti16 --img-size 16000", "more than the 65536 tokens vitkit builds"),
        ("analyze w.safetensors --images img.png --out o --layers 9", "layer 9: the model has 2 layers"),
        ("analyze w.safetensors --images img.png --out o --layers -3", "layer -3: the model has 2 layers"),
    ],
)
def test_a_value_that_does_not_fit_the_model_is_one_line(files, capsys, argv, message):
    assert main(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_overflowing_logits_are_refused_not_printed_as_nan(files, capsys):
    """Finite weights whose activations overflow: a softmax of inf is NaN, argmax(NaN) is class 0.
    predict and eval say so instead of printing "nan%" or a top-1 beside a correct table."""
    m = vitkit.load_pretrained(files / "w.safetensors")
    with torch.no_grad():
        m.head.weight.fill_(3e38)  # finite, but its products are not
    vitkit.save_checkpoint(m, files / "big.safetensors")
    assert main(["predict", "big.safetensors", "img.png"]) == 2
    assert "outputs are not finite for image 1 of 1" in capsys.readouterr().err
    assert main(["eval", "big.safetensors", "--data", "synthetic", "--max-images", "32"]) == 2
    assert "logits are not finite for 32 of the 32 images scored" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        "convert w.safetensors a_file/x.safetensors",
        "predict w.safetensors img.png --json a_file/x.json",
        "analyze w.safetensors --images img.png --out a_file/deeper/an",
    ],
)
def test_writing_under_a_file_names_the_file_in_the_way(files, capsys, argv):
    (files / "a_file").write_text("x")
    assert main(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vitkit {argv.split()[0]}: error: a_file: a file, not a folder: a_file/") and "\n" not in err
