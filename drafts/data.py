"""Training data for every family (docs/methods/gumiho.md, Training data): ShareGPT conversations rendered with the
target's chat template, and the draft vocabulary they choose.

The packaged ShareGPT JSON stops mid-record, so it is read record by record (`evaluation.corpus`). Each
conversation becomes `input_ids` and a loss mask that is 1 on assistant-reply tokens only: the text is rendered
turn by turn, the character span of every reply is the growth of the rendering when the reply is added, and a
token is an assistant token when its first character lies in such a span. The replies are ShareGPT's own; the
target's hidden states are computed on the fly by the trainer, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import takewhile
from typing import Iterator, Optional

from evaluation.corpus import corpus_path, iter_records

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant"}


@dataclass
class Sample:
    record: int  # index of the record in the corpus (the data position for resuming)
    input_ids: list[int]
    loss_mask: list[int]


def messages_of(record: dict) -> list[dict]:
    """Alternating user/assistant messages; a leading assistant turn is dropped, an out-of-turn one ends it."""
    messages = []
    for turn in record.get("conversations") or []:
        role = ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            continue
        if not messages and role == "assistant":
            continue
        expected = "user" if len(messages) % 2 == 0 else "assistant"
        if role != expected:
            break
        messages.append({"role": role, "content": turn.get("value") or ""})
    return messages


def _render(tokenizer, chat_template: str, messages: list[dict], generation_prompt: bool) -> str:
    if chat_template == "tokenizer":
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    from fastchat.conversation import get_conv_template

    conv = get_conv_template(chat_template.split(":", 1)[1])
    for message in messages:
        conv.append_message(conv.roles[0 if message["role"] == "user" else 1], message["content"])
    if generation_prompt:
        conv.append_message(conv.roles[1], None)
    return conv.get_prompt()


def render(tokenizer, chat_template: str, messages: list[dict], max_length: int) -> Optional[tuple[list, list]]:
    """(input_ids, loss_mask) cut to `max_length` tokens, or None when no assistant token is left."""
    spans = []
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(_render(tokenizer, chat_template, messages[:k], True))
            end = len(_render(tokenizer, chat_template, messages[: k + 1], False))
            spans.append((start, end))
    if not spans:
        return None
    text = _render(tokenizer, chat_template, messages, False)
    # The tokenizer template spells its special tokens in the text; fschat prompts get the tokenizer's BOS.
    encoded = tokenizer(text, add_special_tokens=chat_template != "tokenizer", return_offsets_mapping=True,
                        truncation=True, max_length=max_length)
    mask = []
    for begin, end in encoded["offset_mapping"]:
        mask.append(int(end > begin and any(s <= begin < e for s, e in spans)))
    if not any(mask):
        return None
    return list(encoded["input_ids"]), mask


def iter_samples(tokenizer, chat_template: str, max_length: int, start: int = 0,
                 corpus: Optional[str] = None) -> Iterator[Sample]:
    """Samples in corpus order from record `start` on (records without an assistant token are skipped)."""
    with corpus_path(corpus) as path:
        for index, record in enumerate(iter_records(path)):
            if index < start:
                continue
            rendered = render(tokenizer, chat_template, messages_of(record), max_length)
            if rendered is not None:
                yield Sample(index, *rendered)


def count_assistant_tokens(samples, vocab_size: int):
    """How often each target token occurs in the assistant text of `samples` (EAGLE-3's draft-vocabulary recipe):
    an int64 tensor [vocab_size]."""
    import torch

    counts = torch.zeros(vocab_size, dtype=torch.long)
    for sample in samples:
        ids = torch.tensor(sample.input_ids)[torch.tensor(sample.loss_mask, dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def most_frequent(counts, n: int):
    """The ids of the `n` largest counts, ties to the lower id (a stable order)."""
    import torch

    order = torch.sort(-counts, stable=True).indices
    return order[:n]


def training_vocabulary(lm, options):
    """The sorted target ids of a reduced draft vocabulary (None: the whole vocabulary): the `draft_vocab` target
    tokens most frequent in the assistant text of the first `vocab_records` records the run reads, as the target
    tokenizes it; ties go to the lower id (EAGLE-3's recipe; Medusa and Hydra use it too)."""
    import torch

    vocab = lm.model.config.vocab_size
    if options.draft_vocab is None or options.draft_vocab >= vocab:
        return None
    samples = takewhile(lambda s: s.record < options.vocab_records,
                        iter_samples(lm.tokenizer, lm.chat_template, options.max_length, 0, options.corpus))
    counts = count_assistant_tokens(samples, vocab)
    return torch.sort(most_frequent(counts, options.draft_vocab)).values
