"""The harness from Python: a target and a method loaded by the command line's names and options, and a prompt or
a chat answered by the one decode loop, with what a run records of it.

    from specdec import load
    target = load("smollm2-135m")                          # a conf/model name; model options as keywords
    pld = target.method("pld", max_ngram_size=3)           # a conf/method name; its options as keywords
    out = pld.generate("Name three colours.", max_new_tokens=64)
    print(out.text, out.mat, out.accept_lengths, out.seconds)   # seconds: per part of the step, adding up
    chat = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name three colours."}]
    pld.generate(chat, temperature=0.7, seed=1)            # the last user turn, after the earlier ones

Every option is checked as `run.py` checks it (one `HarnessError` line naming it); under greedy decoding every
method's tokens equal vanilla's, as on the command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CONF = Path(__file__).resolve().parent.parent / "conf"

__all__ = ["load", "Target", "Generator", "Generation"]


@dataclass
class Generation:
    """One answer: its text and token ids, the tokens committed per step (the prefill step included), the seconds
    of each part of the loop (they add up to `wall_time`) and why it stopped."""

    text: str
    token_ids: list[int]
    accept_lengths: list[int]
    wall_time: float
    seconds: dict[str, float] = field(default_factory=dict)
    stop_reason: str = ""

    @property
    def mat(self) -> float:
        """Mean accepted tokens: tokens per step of the target, as the report counts them."""
        return len(self.token_ids) / max(len(self.accept_lengths), 1)


def _config(overrides: list[str], options: dict[str, dict]):
    """The composed config of `overrides`, with `options` ({group: {key: value}}) set as Python values, checked
    as a run's are (`evaluation.run.validation.validate`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException
    from omegaconf import open_dict

    from evaluation.engine.errors import HarnessError
    from evaluation.run.config import register_configs
    from evaluation.run.validation import option_error_from_hydra, validate

    register_configs()
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
            cfg = compose("config", overrides=overrides)
    except ConfigCompositionException as exc:  # a name that is not in conf/ (the closest one suggested)
        raise (option_error_from_hydra(exc, overrides) or HarnessError(" ".join(str(exc).split()))) from None
    for group, values in options.items():
        with open_dict(cfg[group]):  # an unknown key is then refused by name, with the group's options
            for key, value in values.items():
                cfg[group][key] = value
    return validate(cfg)


class Target:
    """A loaded target model (`load`); `method` builds a decoding method on it."""

    def __init__(self, spec, lm):
        self.spec, self.lm = spec, lm

    @property
    def name(self) -> str:
        return self.spec.model.name

    def method(self, name: str = "vanilla", **options) -> "Generator":
        """The method of conf/method/<name>.yaml on this target, `options` replacing its defaults."""
        from evaluation.run import preflight
        from evaluation.run.answerers import build_method

        spec = _config([f"model={self.name}", f"method={name}"], {"method": options})
        preflight.check([spec])  # its checkpoint found, or one line naming what to fetch
        return Generator(self, build_method(spec, self.lm))


class Generator:
    """A method on a target: `generate` answers a prompt or a chat."""

    def __init__(self, target: Target, method):
        self.target, self.method = target, method

    def generate(self, prompt: str | list[dict], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> Generation:
        """Greedy by default; at `temperature` > 0 sampled through the engine's exact rule, seeded by `seed`."""
        from evaluation.engine import decode_turn
        from evaluation.engine.errors import HarnessError
        from evaluation.engine.sampling import Sampler, SamplingParams
        from evaluation.templates import build_prompt_ids

        lm = self.target.lm
        history, question = _turns(prompt)
        ids = build_prompt_ids(lm.tokenizer, lm.chat_template, history, question)
        if len(ids) >= lm.max_context:
            raise HarnessError(f"prompt of {len(ids)} tokens does not fit the context of {lm.max_context}")
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k))
        sampler = None if params.greedy else Sampler(params, seed)
        result = decode_turn(lm, self.method, ids, int(max_new_tokens), sampler=sampler)
        return Generation(text=lm.tokenizer.decode(result.new_ids, skip_special_tokens=True).strip(),
                          token_ids=list(result.new_ids), accept_lengths=list(result.accept_lengths),
                          wall_time=result.wall_time, seconds=dict(result.seconds), stop_reason=result.stop_reason)


def _turns(prompt) -> tuple[list[tuple[str, str]], str]:
    """(earlier (user, assistant) turns, the question) of a prompt string or a chat ending with a user turn."""
    from evaluation.engine.errors import HarnessError

    if isinstance(prompt, str):
        return [], prompt
    messages = list(prompt or [])
    roles = [m.get("role") for m in messages]
    expected = ["user", "assistant"] * (len(messages) // 2) + ["user"]
    if not messages or roles != expected[: len(messages)] or roles[-1] != "user":
        raise HarnessError("a chat is alternating user and assistant messages ending with a user message")
    pairs = [(messages[i]["content"], messages[i + 1]["content"]) for i in range(0, len(messages) - 1, 2)]
    return pairs, messages[-1]["content"]


def load(model: str = "smollm2-135m", device: str = "auto", **model_options) -> Target:
    """The target of conf/model/<model>.yaml, `model_options` (dtype, path, max_context, ...) replacing its
    defaults, on `device` (auto: a GPU when there is one)."""
    from evaluation.models import load_model

    spec = _config([f"model={model}", f"run.device={device}"], {"model": model_options})
    return Target(spec, load_model(spec.model, spec.run.device))
