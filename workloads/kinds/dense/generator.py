"""DiffCSE's frozen generator: who fills the masked tokens the discriminator must detect.

- ``frequency`` (:class:`FrequencyGenerator`, the offline default): each masked token is
  replaced by a token drawn from the training texts' own token frequencies (special tokens
  left out). No model is needed, so it runs on a machine without a pretrained MLM head; it is
  an ablation, not the thesis's setting: its replacements ignore the context, so they are
  easier to detect than an MLM's plausible ones.
- a masked-LM id or path (:class:`MaskedLMGenerator`; ``distilbert-base-uncased``, the
  thesis's best, for users with internet), run as the authors run it (voidism/DiffCSE: the
  data collator's ``mask_tokens`` and ``cl_forward``): of the drawn positions 80% become
  [MASK], 10% a uniformly random token and 10% stay; the frozen MLM reads that text and its
  argmax is taken at **every** real position (so an unmasked token the MLM changes counts as
  replaced too), the first position ([CLS], which carries the condition) kept. Its vocabulary
  must be the encoder's (the discriminator reads its token ids).

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


MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # BERT's split of the drawn positions (the rest keep their token)


def mlm_input(input_ids: torch.Tensor, masked: torch.Tensor, mask_token_id: int, vocab_size: int,
              draws: torch.Generator | None = None) -> torch.Tensor:
    """The generator's input: of the ``masked`` positions 80% [MASK], 10% a uniform random token, 10% kept."""
    split = torch.rand(masked.shape, generator=draws, device="cpu").to(masked.device)
    random_tokens = torch.randint(vocab_size, masked.shape, generator=draws, device="cpu").to(input_ids.device, input_ids.dtype)
    out = torch.where(masked & (split < MASK_SHARE), torch.full_like(input_ids, mask_token_id), input_ids)
    return torch.where(masked & (split >= MASK_SHARE) & (split < MASK_SHARE + RANDOM_SHARE), random_tokens, out)


class MaskedLMGenerator:
    """A frozen masked language model (eval mode, no gradient) on the 80/10/10 masked text, argmax at every position."""

    def __init__(self, model: torch.nn.Module, mask_token_id: int) -> None:
        self.model, self.mask_token_id = model.eval().requires_grad_(False), mask_token_id
        self.vocab_size = int(model.config.vocab_size)

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
        corrupted = mlm_input(input_ids, masked, self.mask_token_id, self.vocab_size, draws)
        predicted = self.model(input_ids=corrupted, attention_mask=attention_mask).logits.argmax(-1)
        predicted[:, 0] = input_ids[:, 0]  # the authors' g_pred[:, 0] = cls_token
        return torch.where(attention_mask.bool(), predicted, input_ids)  # padding stays padding (their g_pred * mask)


def build_generator(name: str, tokenizer: PreTrainedTokenizerBase, texts: Iterable[str]):
    """``frequency`` (counts over ``texts``) or a masked-LM id or path."""
    if name == "frequency":
        return FrequencyGenerator.from_texts(tokenizer, texts)
    return MaskedLMGenerator.from_pretrained(name, tokenizer)


__all__ = ["FrequencyGenerator", "MaskedLMGenerator", "build_generator", "mlm_input"]
