"""Chat prompts. The template is named by the model's config, never guessed from the model's name."""

from __future__ import annotations

from evaluation.engine.errors import HarnessError


def build_prompt_ids(tokenizer, chat_template: str, history: list[tuple[str, str]], question: str) -> list[int]:
    """Token ids of the prompt for `question`, after the earlier (question, answer) turns of `history`."""
    if chat_template == "tokenizer":
        messages = []
        for asked, answered in history:
            messages += [{"role": "user", "content": asked}, {"role": "assistant", "content": answered}]
        messages.append({"role": "user", "content": question})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)
    if chat_template.startswith("fschat:"):
        from fastchat.conversation import get_conv_template

        try:
            conv = get_conv_template(chat_template.split(":", 1)[1])
        except KeyError:
            raise HarnessError(f"unknown fschat conversation template {chat_template!r}") from None
        for asked, answered in history:
            conv.append_message(conv.roles[0], asked)
            conv.append_message(conv.roles[1], answered)
        conv.append_message(conv.roles[0], question)
        conv.append_message(conv.roles[1], None)
        # As Spec-Bench: the tokenizer adds BOS; a literal "</s>" between turns becomes the EOS id.
        return list(tokenizer(conv.get_prompt()).input_ids)
    raise HarnessError(f"chat_template must be 'tokenizer' or 'fschat:<name>', not {chat_template!r}")


def answer_text(tokenizer, new_ids: list[int]) -> str:
    """The answer as the next turn sees it: special tokens removed, whitespace stripped (as Spec-Bench)."""
    return tokenizer.decode(new_ids, skip_special_tokens=True).strip()
