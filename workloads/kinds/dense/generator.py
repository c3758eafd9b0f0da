"""DiffCSE's frozen generator: who fills the masked tokens the discriminator must detect.

- ``frequency`` (:class:`FrequencyGenerator`, the offline default): each masked token is
  replaced by a token drawn from the training texts' own token frequencies (special tokens
  left out). No model is needed, so it runs on a machine without a pretrained MLM head; it is
  an ablation, not the thesis's setting: its replacements ignore the context, so they are
  easier to detect than an MLM's plausible ones.
- a masked-LM id or path (:class:`MaskedLMGenerator`; ``distilbert-base-uncased``, the
  thesis's best, for users with internet): the masked text through the frozen MLM, each
  masked position filled with its most likely token (argmax, as the authors' code). Its
  vocabulary must be the encoder's (the discriminator reads its token ids).

A drawn or predicted token equal to the original counts as original (``rtd_labels``).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import AutoModelForMaskedLM, PreTrainedTokenizerBase

from workloads.core.errors import InputError
from workloads.models.cross_encoder import resolve_model_name


class FrequencyGenerator:
    """Replacements drawn from unigram token counts (add-one smoothed over the seen tokens)."""

    def __init__(self, counts: torch.Tensor) -> None:
        if counts.sum() <= 0:
            raise ValueError("the frequency generator saw no token to draw from")
        self.probabilities = counts.double() / counts.sum()

    @classmethod
    def from_texts(cls, tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]) -> FrequencyGenerator:
        counts = torch.zeros(len(tokenizer), dtype=torch.float64)
        special = set(tokenizer.all_special_ids)
        for text in texts:
            ids = [i for i in tokenizer(text, add_special_tokens=False, truncation=True, max_length=512)["input_ids"]
                   if i not in special]
            if ids:
                counts.index_add_(0, torch.tensor(ids), torch.ones(len(ids), dtype=torch.float64))
        return cls(counts)

    def fill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, masked: torch.Tensor,
             draws: torch.Generator | None = None) -> torch.Tensor:
        out = input_ids.clone()
        count = int(masked.sum())
        if count:
            drawn = torch.multinomial(self.probabilities, count, replacement=True, generator=draws)
            out[masked] = drawn.to(out.device, out.dtype)
        return out


class MaskedLMGenerator:
    """A frozen masked language model (eval mode, no gradient), argmax at the masked positions."""

    def __init__(self, model: torch.nn.Module, mask_token_id: int) -> None:
        self.model, self.mask_token_id = model.eval().requires_grad_(False), mask_token_id

    @classmethod
    def from_pretrained(cls, name: str, tokenizer: PreTrainedTokenizerBase) -> MaskedLMGenerator:
        try:
            model = AutoModelForMaskedLM.from_pretrained(resolve_model_name(name))
        except (OSError, ValueError) as exc:
            raise InputError(name, f"dense.generator: cannot load a masked language model ({str(exc).splitlines()[0]})") from None
        if model.config.vocab_size != len(tokenizer) or tokenizer.mask_token_id is None:
            raise InputError(name, f"dense.generator: its vocabulary ({model.config.vocab_size} tokens) is not the encoder's "
                                   f"({len(tokenizer)}): the discriminator reads the encoder's token ids")
        return cls(model, tokenizer.mask_token_id)

    def to(self, device: torch.device) -> MaskedLMGenerator:
        self.model.to(device)
        return self

    @torch.no_grad()
    def fill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, masked: torch.Tensor,
             draws: torch.Generator | None = None) -> torch.Tensor:
        logits = self.model(input_ids=input_ids.masked_fill(masked, self.mask_token_id), attention_mask=attention_mask).logits
        return torch.where(masked, logits.argmax(-1), input_ids)


def build_generator(name: str, tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]):
    """``frequency`` (counts over ``texts``) or a masked-LM id or path."""
    if name == "frequency":
        return FrequencyGenerator.from_texts(tokenizer, texts)
    return MaskedLMGenerator.from_pretrained(name, tokenizer)


__all__ = ["FrequencyGenerator", "MaskedLMGenerator", "build_generator"]
