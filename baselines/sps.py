"""SpS, standard speculative sampling (docs/methods/sps.md): a smaller causal LM drafts a chain, the target verifies.

The draft is a separate model that shares the target's tokenizer (`draft_model=<hub id or folder>`), or the target's
own first layers with its final norm and head (`draft_model=self`, self-speculative: no training, no second model).
Each step the draft catches up on the tokens committed since its last step (its own preallocated KV cache, cropped
back to what was accepted) and proposes `gamma` tokens one at a time. The length follows transformers' assisted
generation: start each turn at `gamma`, +2 after a step that accepted every draft, -1 (at least 1) otherwise.

At temperature > 0 the draft samples its tokens from its own processed distribution q (the target's temperature,
top-k and top-p) and hands q to the engine's rule, which accepts with min(1, p/q) and resamples from the residual:
standard speculative sampling, exact. `sampled_drafts=false` drafts the argmax instead, verified as deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from evaluation.checkpoints import PairedCheckpoint
from evaluation.engine.errors import HarnessError, require
from evaluation.engine.kv_cache import PositionalKVCache, cache_argument
from evaluation.engine.method import DecodeState, Method, StepOutcome
from evaluation.engine.options import MAX_DRAFT_NODES, require_choice, require_int_range
from evaluation.engine.tree import DraftTree

SCHEDULES = ("heuristic", "constant")


class DraftLM:
    """A causal LM over the target's vocabulary with its own KV cache: `extend` feeds tokens at the next positions
    and returns their logits; `crop` forgets positions past a length."""

    def __init__(self, num_cache_layers: int, capacity: int, device: torch.device, dtype: torch.dtype, vocab: int):
        self.cache = PositionalKVCache(num_cache_layers, capacity)
        self.length = 0  # positions in the cache
        self.device, self.dtype, self.vocab = device, dtype, vocab

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)
        self.cache.crop(self.length)

    def extend(self, tokens: list[int]) -> torch.Tensor:
        """Logits [len(tokens), vocab] of the tokens placed at positions length, length + 1, ..."""
        n, start = len(tokens), self.length
        ids = torch.tensor([tokens], device=self.device)
        positions = torch.arange(start, start + n, device=self.device).unsqueeze(0)
        mask = torch.zeros((n, start + n), dtype=self.dtype, device=self.device)
        mask[:, start:] = torch.full((n, n), torch.finfo(self.dtype).min, dtype=self.dtype,
                                     device=self.device).triu_(1)
        logits = self._logits(ids, positions, mask[None, None])
        self.length += n
        return logits[0, :, : self.vocab]

    def _logits(self, ids, positions, mask) -> torch.Tensor:
        raise NotImplementedError


class SeparateDraft(DraftLM):
    """Another transformers causal LM, loaded like a target (same device and dtype)."""

    def __init__(self, model, capacity: int, device, dtype, vocab: int):
        super().__init__(model.config.num_hidden_layers, capacity, device, dtype, vocab)
        self.model = model

    def _logits(self, ids, positions, mask):
        return self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                          **cache_argument(self.model, self.cache), use_cache=True).logits


class SelfDraft(DraftLM):
    """The target's own decoder layers `layers` (in order), then its final norm and head. The layers keep their
    index into the cache, so the cache has the target's layer count; layers not used are never allocated."""

    def __init__(self, target, layers: list[int], capacity: int, device, dtype):
        super().__init__(target.config.num_hidden_layers, capacity, device, dtype, target.config.vocab_size)
        self.inner, self.head = target.model, target.lm_head
        self.layers = [self.inner.layers[i] for i in layers]

    def _logits(self, ids, positions, mask):
        hidden = self.inner.embed_tokens(ids)
        position_embeddings = self.inner.rotary_emb(hidden, positions)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_ids=positions, position_embeddings=position_embeddings,
                           **cache_argument(layer, self.cache), use_cache=True)
        return self.head(self.inner.norm(hidden))


def self_draft_layers(option, num_layers: int) -> list[int]:
    """The target layers a self-draft runs: the first N for an integer N, the given indices for a list, and by
    default the first eighth (rounded, at least one: 4 of SmolLM2's 30; `evaluation.tools.sps_layers` chose it)."""
    if option is None:
        return list(range(max(1, round(num_layers / 8))))
    if isinstance(option, int):
        require_int_range("draft_layers", option, 1, num_layers)
        return list(range(option))
    layers = [int(i) for i in option]
    ok = bool(layers) and all(0 <= i < num_layers for i in layers) and layers == sorted(set(layers))
    require(ok, "draft_layers", list(option), f"increasing layer indices in [0, {num_layers - 1}]")
    return layers


def load_separate_draft(source: str, lm):
    """The draft model `source` (hub id or folder) on the target's device and dtype; one line when its vocabulary
    is not the target's."""
    from evaluation.models import load_companion_model

    model, tokenizer = load_companion_model(source, lm)
    if lm.tokenizer is not None and tokenizer.get_vocab() != lm.tokenizer.get_vocab():
        raise HarnessError(f"draft model {source!r} has another vocabulary than the target {lm.name!r} "
                           f"({len(tokenizer)} against {len(lm.tokenizer)} tokens): SpS needs the target's tokenizer")
    if model.config.vocab_size < lm.model.config.vocab_size:
        raise HarnessError(f"draft model {source!r} scores {model.config.vocab_size} tokens, the target "
                           f"{lm.model.config.vocab_size}: SpS needs the target's vocabulary")
    return model


class SpS(PairedCheckpoint, Method):
    """Speculative sampling with a draft model: one chain of up to `gamma` tokens per step."""

    checkpoint_kind = "draft-model"  # the draft models paired with targets (conf/checkpoints.yaml)
    checkpoint_option = "draft_model"
    fallback = " (or run method=sps-self)"

    @dataclass
    class Config:
        # A hub id or folder of a causal LM with the target's tokenizer, or "self": the target's own layers
        # (`draft_layers`; method=sps-self); null: the draft paired with the target (conf/checkpoints.yaml: Spec-Bench's
        # double7/vicuna-68m for Vicuna)
        draft_model: str | None = None
        # With draft_model=self: the first N target layers (an integer) or a list of layer indices; null: the
        # first eighth of the layers
        draft_layers: Any = None
        gamma: int = 5  # draft tokens per step at the start of each turn (transformers' num_assistant_tokens)
        schedule: str = "heuristic"  # heuristic: +2 after a fully accepted step, else -1 (at least 1); constant
        max_gamma: int = 64  # a cap (upstream has none): the cache reserves this many draft slots
        # At temperature > 0: draw the drafts from the draft's distribution and hand it to the rule (accept with
        # min(1, p/q)); false: draft the argmax, verified as a deterministic draft (also exact)
        sampled_drafts: bool = True
        # Upstream's quirk (transformers 4.37, Spec-Bench's SpS): at T > 0 the drafts are the argmax, yet handed to
        # the rule with the draft's distribution as if sampled from it. Biased; the exactness check must reject it.
        greedy_drafts_with_q: bool = False

        def check(self) -> None:
            from evaluation.hub import is_folder_or_hub_id

            named = self.draft_model
            require(named is None or named == "self" or is_folder_or_hub_id(named), "draft_model", named,
                    "null (the draft paired with the target), a hub id (owner/name) or an existing folder of a causal "
                    "LM with the target's tokenizer, or 'self' (the target's first layers: method=sps-self)")
            require_int_range("max_gamma", self.max_gamma, 1, MAX_DRAFT_NODES)
            require_int_range("gamma", self.gamma, 1, self.max_gamma)
            require_choice("schedule", self.schedule, SCHEDULES)
            if self.draft_layers is not None:
                require(self.draft_model == "self", "draft_layers", self.draft_layers,
                        "null unless draft_model=self")
                ok = isinstance(self.draft_layers, int) or (
                    isinstance(self.draft_layers, (list, tuple)) and all(isinstance(i, int) for i in self.draft_layers))
                require(ok, "draft_layers", self.draft_layers, "an integer or a list of layer indices")

    def __init__(self, config, model):
        super().__init__(config, model)
        config.check()
        lm = model
        capacity = int(lm.max_context) + config.max_gamma + 2
        if config.draft_model == "self":
            self.layers = self_draft_layers(config.draft_layers, lm.model.config.num_hidden_layers)
            self.draft_lm: DraftLM = SelfDraft(lm.model, self.layers, capacity, lm.device, lm.dtype)
        else:
            source = self.checkpoint_source(config, lm.name)
            self.layers = None
            self.draft_lm = SeparateDraft(load_separate_draft(source, lm), capacity, lm.device,
                                          lm.dtype, lm.model.config.vocab_size)
        self.stop_ids = lm.stop_ids
        self.gamma = float(config.gamma)
        self.proposed = 0  # tokens of the last draft
        self.fed = 0  # of them, those fed to the draft model (its cache holds them)

    @property
    def max_nodes(self) -> int:
        return self.config.max_gamma

    def reset(self, prompt_ids, hidden_states=None) -> None:
        """A new turn: the draft length starts over, as each `generate` call does, and the draft reads the new
        prompt from its start at the first step."""
        self.gamma = float(self.config.gamma)
        self.draft_lm.crop(0)
        self.proposed = self.fed = 0

    @torch.inference_mode()
    def draft(self, state: DecodeState) -> DraftTree:
        tokens = state.tokens
        room = state.max_new_tokens - state.generated - 1  # the bonus token takes the last place
        count = min(int(self.gamma), room)
        self.proposed = self.fed = 0
        if count < 1:
            return DraftTree()
        logits = self.draft_lm.extend(tokens[self.draft_lm.length:])[-1]
        sampler = state.sampler if self.config.sampled_drafts else None
        drafts, probs = [], []
        for j in range(count):
            if sampler is not None:
                q = sampler.probabilities(logits)
                token = int(q.argmax()) if self.config.greedy_drafts_with_q else sampler.draw(q)
                probs.append(q)
            else:
                token = int(logits.argmax())
            drafts.append(token)
            if token in self.stop_ids or j + 1 == count:
                break
            logits = self.draft_lm.extend([token])[-1]
            self.fed += 1
        self.proposed = len(drafts)
        tree = DraftTree.chain(drafts)
        if probs:
            tree.draft_probs = torch.stack(probs)
        return tree

    def update(self, state: DecodeState, outcome: StepOutcome) -> None:
        if not outcome.drafted:
            return
        accepted = len(outcome.verdict.path) - 1  # a chain: the accepted drafts are its first nodes
        # The draft's cache holds the committed tokens up to the pending one, then the drafts it was fed: keep
        # those accepted.
        committed_before = len(state.tokens) - len(outcome.committed)
        self.draft_lm.crop(committed_before + min(accepted, self.fed))
        if self.config.schedule == "heuristic" and self.proposed:
            if accepted == int(self.gamma):
                self.gamma = min(self.gamma + 2.0, float(self.config.max_gamma))
            else:
                self.gamma = max(1.0, self.gamma - 1.0)


class SelfSpeculative(SpS):
    """SpS drafting with the target's own first layers, its final norm and head (self-speculative decoding)."""

    @dataclass
    class Config(SpS.Config):
        draft_model: str | None = "self"

    @classmethod
    def unavailable_reason(cls, model_name: str) -> str | None:
        return None
