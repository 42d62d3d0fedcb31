"""What a run keeps on disk: resumable checkpoints (``checkpoints/step_*.safetensors``), the best
weights (``best.safetensors``) and the resume from the latest readable checkpoint; never a file of
non-finite weights. Every process calls :meth:`Keeper.save` (FSDP gathers its shards); only the
main one writes.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.adapters import save_adapters
from ..checkpoint.native import save_weights
from ..errors import TrainingError
from ..models.adapters import adapted_layers, apply_adapters, merge_adapters
from ..models.registry import build_model
from . import dist as D
from .config import dump_recipe
from .optim import lr_at
from .plan import RunPlan
from .runfolder import RunFolder
from .state import TrainState, latest_loadable, list_checkpoints, nonfinite_names, save_train_state


class EMA:
    """Polyak averaging of the weights (fp32 shadow copy), used for evaluation when enabled.

    Args:
        model: the model whose weights are averaged.
        decay: the shadow's decay a step.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the shadow towards the model's weights (one step).

        Args:
            model: the model.
        """
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.dtype.is_floating_point:
                s.mul_(self.decay).add_(v.detach().float(), alpha=1 - self.decay)
            else:
                s.copy_(v)

    @contextlib.contextmanager
    def applied(self, model: nn.Module):
        """The shadow's weights in ``model`` for the block, its own after.

        Args:
            model: the model.
        """
        backup = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.to(backup[k].dtype) for k, v in self.shadow.items()})
        try:
            yield
        finally:
            model.load_state_dict(backup)


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself, out of DDP's and torch.compile's wrappers.

    Args:
        model: a model, wrapped or not.

    Returns:
        The innermost module.
    """
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


class Keeper:
    """Checkpoints, the best weights and the resume of one run.

    Args:
        plan: the run's plan.
        folder: the run folder.
        model: the model being trained (on its device; its FSDP shards).
        optimizer: its optimiser.
        ema: the averaged weights, or None.
        say: says a line (resumes, skipped checkpoints).
    """

    def __init__(
        self, plan: RunPlan, folder: RunFolder, model: nn.Module, optimizer: Any, ema: EMA | None, say: Any
    ) -> None:
        self.plan, self.folder, self.model, self.optimizer, self.ema, self.say = (
            plan,
            folder,
            model,
            optimizer,
            ema,
            say,
        )
        self.checkpoints = folder.out / "checkpoints"

    def resume(self, state: TrainState) -> TrainState:
        """Load the latest checkpoint that reads back with finite weights, if there is one.

        Args:
            state: the state of a fresh start (its teacher digest and precision are kept).

        Returns:
            The resumed state, or ``state`` when there is nothing to resume.

        Raises:
            TrainingError: checkpoints exist but none reads back, or the teacher changed.
        """
        if not list_checkpoints(self.checkpoints):
            return state
        skipped: list[str] = []
        shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
        loaded = latest_loadable(self.checkpoints, skipped, shapes)
        if loaded is None:
            raise TrainingError(
                f"{self.checkpoints}: no checkpoint of this model reads back with finite weights "
                f"({'; '.join(skipped[:3])}); cannot resume. Move the folder away to start afresh"
            )
        if skipped:
            self.say(f"skipped checkpoint {', '.join(skipped)}; resuming from {loaded.path.name}")
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(  # full (unsharded) tensors in the file; sharded again under FSDP
            self.model,
            self.optimizer,
            model_state_dict=loaded.model_state,
            optim_state_dict=loaded.optim_state,
            options=StateDictOptions(full_state_dict=True),
        )
        device = self.plan.env.device
        if self.ema is not None and loaded.ema_state is not None:
            self.ema.shadow = {k: v.float().to(device) for k, v in loaded.ema_state.items()}
        if "torch" in loaded.rng:
            torch.set_rng_state(loaded.rng["torch"])
        if "cuda" in loaded.rng and device.type == "cuda":
            torch.cuda.set_rng_state(loaded.rng["cuda"])
        self._check_same_teacher(loaded.state.teacher_digest, state.teacher_digest)
        loaded.state.teacher_digest = state.teacher_digest  # an older checkpoint's None too
        before, now = loaded.state.precision, self.plan.precision
        if before is not None and before != now.name:  # the weights on disk are fp32 either way
            self.say(f"resuming in {now.name} a run whose steps so far computed in {before} ({now.describe()})")
        loaded.state.precision = now.name
        self.say(f"resuming {self.folder.out} from step {loaded.state.step}")
        return loaded.state

    def _check_same_teacher(self, saved: str | None, now: str | None) -> None:
        """A resumed distillation run must learn from the teacher it started with (a checkpoint
        from before the digest was kept, None, cannot be checked)."""
        if saved is None or saved == now:
            return
        raise TrainingError(
            f"train.teacher {self.plan.recipe.train.teacher}: its weights changed since this run started "
            f"(sha256 {saved[:12]}... then, {str(now)[:12]}... now); put the first teacher back "
            "to resume, or use another --out to start afresh"
        )

    def _full_state(self) -> tuple[dict, dict]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def nonfinite(self) -> list[str]:
        """The weights, EMA weights and optimiser state holding a NaN or an infinity (this
        process's shard of them under FSDP); every process gets the same answer (a collective).

        Returns:
            Their names; empty when all are finite.
        """

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard

        names = {p: n for n, p in self.model.named_parameters()}
        tensors = {n: local(p.detach()) for n, p in self.model.named_parameters()}
        tensors.update({f"buffer {n}": local(b) for n, b in self.model.named_buffers()})
        if self.ema is not None:
            tensors.update({f"EMA {k}": v for k, v in self.ema.shadow.items()})
        for p, st in self.optimizer.state.items():
            name = names.get(p, "?")
            tensors.update({f"optimizer {name}/{k}": local(v) for k, v in st.items() if torch.is_tensor(v)})
        bad = nonfinite_names(tensors)
        info = self.plan.env.info
        count = D.all_reduce_sum(torch.tensor(float(len(bad)), device=self.plan.env.device), info)
        return bad or (["the weights of another process"] if count.item() else [])

    def stop_if_nonfinite(self, state: TrainState, consequence: str) -> None:
        """Stop before non-finite weights are evaluated, saved or trained on further.

        Args:
            state: the run's state.
            consequence: what was not done, for the message.

        Raises:
            TrainingError: some weights are not finite.
        """
        bad = self.nonfinite()
        if bad:
            r, step = self.plan.recipe, state.step
            raise TrainingError(
                f"the weights are not finite at step {step} ({', '.join(bad[:3])}; lr "
                f"{lr_at(max(step - 1, 0), r.train.steps, r.optim):.3g}): {consequence}; "
                f"{self.folder.kept(state.best_step)}. Lower the learning rate (optim.lr, optim.warmup_steps)"
            )

    def save(self, state: TrainState) -> Path | None:
        """Write a resumable checkpoint of this step into ``checkpoints/``, and remove those
        beyond the recipe's ``log.keep_last``.

        Args:
            state: the run's state.

        Returns:
            The checkpoint written; None on the processes other than the main one.

        Raises:
            TrainingError: the weights are not finite (nothing is written), or the file cannot
                be written.
        """
        step, plan = state.step, self.plan
        self.stop_if_nonfinite(state, f"checkpoint step_{step:07d} was not written")
        model_sd, optim_sd = self._full_state()  # collective under FSDP: every rank calls it
        if not plan.env.info.is_main:
            return None
        path = self.checkpoints / f"step_{step:07d}.safetensors"
        with self.folder.writing(path, "write the checkpoint", step, state.best_step):
            save_train_state(
                path,
                unwrap(self.model).cfg,
                model_sd,
                optim_sd,
                state,
                dump_recipe(plan.recipe),
                plan.preprocessing,
                plan.train_ds.classes,
                ema_state=self.ema.shadow if self.ema else None,
            )
        for old in list_checkpoints(self.checkpoints)[: -plan.recipe.log.keep_last]:
            with self.folder.writing(old, "remove the old checkpoint", step, state.best_step):
                old.unlink(missing_ok=True)
        return path

    def save_best(self, state: TrainState, thresholds: Any) -> None:
        """Write ``best.safetensors``: the weights (the EMA's when kept; with adapters, merged into
        them, the adapters also alone in ``adapter.safetensors``), the classes and the score.

        Args:
            state: the run's state, whose best metric and step are this evaluation's.
            thresholds: a multi-label run's per-class thresholds (None otherwise).
        """
        model_sd, _ = self._full_state()
        if not self.plan.env.info.is_main:
            return
        classes = json.dumps(self.plan.train_ds.classes)
        if adapted_layers(unwrap(self.model)):  # the adapters alone, and merged weights that serve as any
            adapted = _plain_copy(unwrap(self.model), model_sd)
            path = self.folder.out / "adapter.safetensors"
            with self.folder.writing(path, "write the adapters", state.step, state.best_step):
                save_adapters(adapted, path, {"classes": classes, "step": str(state.step)})
            model_sd = merge_adapters(adapted).state_dict()
        if self.ema is not None:
            model_sd = {k: v.to(model_sd[k].dtype).cpu() for k, v in self.ema.shadow.items()}
        options = self.plan.recipe.data.options
        extra = {
            "decoding": json.dumps({k: options[k] for k in ("load_size", "resize") if k in options}),
            "classes": classes,
            "step": str(state.step),
            "top1": f"{state.best_metric:.6f}",
        }
        if self.plan.multilabel:  # what vitkit predict needs to name an image's labels
            extra.update(multilabel="true", thresholds=json.dumps(thresholds))
            extra["map"] = extra.pop("top1")
        path = self.folder.out / "best.safetensors"
        with self.folder.writing(path, "write the best weights", state.step, state.best_step):
            save_weights(model_sd, unwrap(self.model).cfg, path, self.plan.preprocessing, extra)


def _plain_copy(model: nn.Module, full_state: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of an adapted ``model`` on the CPU with whole tensors: under FSDP its parameters are
    shards, so the copy is built anew (the same config and adapters) from the gathered
    ``full_state``; otherwise a deep copy."""
    if not any(hasattr(p, "to_local") for p in model.parameters()):
        return copy.deepcopy(model).cpu()
    info = model.adapter_info
    plain = apply_adapters(build_model(model.cfg), info.spec, base_name=info.base_name)
    plain.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in full_state.items()})
    plain.adapter_info = info  # the base's checksum, not the fresh model's
    return plain


__all__ = ["EMA", "Keeper", "unwrap"]
