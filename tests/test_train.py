"""Training every draft family on a tiny slice: the data's loss mask, a few steps lower each family's loss, a
stopped run resumes to the state of an uninterrupted one, and the held-out per-depth evaluation runs."""

from __future__ import annotations

import pytest
import torch

from drafts.data import iter_samples, messages_of, render
from drafts.evaluate import depth_accuracy
from drafts.train import Trainer, TrainOptions
from evaluation.families import family as registered
from tests.conftest import question_file


def test_loss_mask_covers_exactly_the_assistant_replies(lm):
    record = {"conversations": [{"from": "gpt", "value": "dropped: a leading reply"},
                                {"from": "human", "value": "Name a colour."},
                                {"from": "gpt", "value": "Blue is a colour."},
                                {"from": "human", "value": "Another one?"},
                                {"from": "gpt", "value": "Green."}]}
    messages = messages_of(record)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    ids, mask = render(lm.tokenizer, lm.chat_template, messages, 512)
    assert ids == lm.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    masked = lm.tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert "Blue is a colour." in masked and "Green." in masked
    assert "colour." in masked and "Name" not in masked and "Another" not in masked and "user" not in masked
    assert render(lm.tokenizer, lm.chat_template, messages, 12) is None or len(render(
        lm.tokenizer, lm.chat_template, messages, 12)[0]) == 12


def test_sharegpt_is_read_record_by_record(lm):
    samples = iter_samples(lm.tokenizer, lm.chat_template, 64)
    first = [next(samples) for _ in range(3)]
    assert all(len(s.input_ids) <= 64 and any(s.loss_mask) for s in first)
    assert first[0].record < first[1].record < first[2].record
    again = next(iter_samples(lm.tokenizer, lm.chat_template, 64, start=first[1].record))
    assert again == first[1]


def options(tmp_path, **changes) -> TrainOptions:
    base = dict(max_length=48, warmup_steps=0, decay_steps=1000, lr=1e-3, eval_questions=1, eval_new_tokens=6,
                question_file=str(question_file()), checkpoint_every_steps=2, progress=False,
                work_dir=str(tmp_path / "work"), out_dir=str(tmp_path / "draft"), candidate_negatives=16)
    base.update(changes)
    return TrainOptions(**base)


def trainer_of(lm, opts: TrainOptions, family="gumiho", name: str = "tiny") -> Trainer:
    """A trainer of `family` (a registered name, or an entry of one's own)."""
    return Trainer(lm, opts, name, registered(family) if isinstance(family, str) else family)


def test_a_few_steps_lower_the_loss(lm, tmp_path):
    trainer = trainer_of(lm, options(tmp_path, mlp_feature_only_tokens=-1, soft_ce="candidates"))
    sample = next(s for s in iter_samples(lm.tokenizer, lm.chat_template, 96) if sum(s.loss_mask) >= 16)
    losses = [trainer.train_step([sample])["loss"] for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses


EAGLE3 = {"mlp_num": 0, "draft_vocab": 1024, "vocab_records": 30, "unroll": 3,
          "soft_ce": "candidates"}


MEDUSA = {"mlp_num": 0, "medusa_heads": 3, "draft_vocab": 1024, "vocab_records": 30}
HYDRA = {"mlp_num": 0, "medusa_heads": 3, "draft_vocab": 1024, "vocab_records": 30}


@pytest.mark.parametrize("family, changes", [("eagle", {"mlp_num": 0}), ("eagle3", EAGLE3), ("medusa", MEDUSA),
                                             ("hydra", HYDRA)], ids=["eagle", "eagle3", "medusa", "hydra"])
def test_a_few_steps_lower_each_familys_loss(lm, tmp_path, family, changes):
    trainer = trainer_of(lm, options(tmp_path, **changes), family)
    sample = next(s for s in iter_samples(lm.tokenizer, lm.chat_template, 96) if sum(s.loss_mask) >= 16)
    losses = [trainer.train_step([sample])["loss"] for _ in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    if family == "eagle3":  # the draft proposes from the 1024 most frequent assistant tokens
        assert trainer.draft.vocab_ids.numel() == 1024 and int(trainer.draft.t2d.sum()) == 1024
    if family in ("medusa", "hydra"):  # three heads over the same 1024 tokens; the method reads them
        assert trainer.draft.num_heads == 3 and trainer.draft.vocab == 1024
        from medusa.heads import load_heads
        from medusa.hydra_heads import load_hydra_heads

        trainer.evaluate()  # the curve the written folder carries
        trainer.save_final({})
        load = load_heads if family == "medusa" else load_hydra_heads
        heads = load(str(tmp_path / "draft"), lm.model)
        assert heads.num_heads == 3 and torch.equal(heads.vocab_ids, trainer.draft.vocab_ids)
        saved = trainer.draft.state_dict()  # float16 on disk
        assert all(torch.equal(v, saved[k].half().float()) for k, v in heads.state_dict().items() if k != "vocab_ids")


# Resuming is the trainer's, whatever the family: a serial draft, EAGLE-3's, and Hydra's heads (dropout draws from
# the saved generator state); Medusa's heads are read back above.
@pytest.mark.parametrize("family, changes", [("gumiho", {}), ("eagle3", EAGLE3), ("hydra", HYDRA)],
                         ids=["gumiho", "eagle3", "hydra"])
def test_a_stopped_run_resumes_to_the_uninterrupted_state(lm, tmp_path, family, changes):
    whole = trainer_of(lm, options(tmp_path / "a", max_steps=4, **changes), family)
    whole.run()
    first = trainer_of(lm, options(tmp_path / "b", max_steps=2, **changes), family)
    first.run()
    resumed = trainer_of(lm, options(tmp_path / "b", max_steps=4, **changes), family)
    resumed.run()
    assert (resumed.step, resumed.tokens, resumed.position) == (whole.step, whole.tokens, whole.position)
    a, b = whole.draft.state_dict(), resumed.draft.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "b" / "draft" / "model.safetensors").is_file()
    assert (tmp_path / "b" / "draft" / "curve.csv").read_text().startswith("tokens,steps,wall_hours,acc1")
    assert torch.equal(resumed.token_counts, whole.token_counts) and int(whole.token_counts.sum()) > 0
    assert (tmp_path / "b" / "draft" / "token_counts.csv").read_text().startswith("token_id,count\n")


def test_per_depth_evaluation_runs(lm):
    from drafts.serial_draft import SerialDraft

    draft = SerialDraft.for_target(lm.model)
    prompt = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Count to five."}], tokenize=True,
                                              add_generation_prompt=True, return_dict=False)
    from evaluation.catalog import method_class
    from evaluation.engine import decode_turn

    continuation = decode_turn(lm, method_class("vanilla")(None, lm), prompt, 16).new_ids
    result = depth_accuracy(draft, lm.model, [(prompt, continuation)])
    assert result["positions"] == len(continuation) - 1
    assert set(result) == {"positions", *(f"acc{d}" for d in range(1, 8))}
    assert all(0.0 <= result[f"acc{d}"] <= 1.0 for d in range(1, 8))
