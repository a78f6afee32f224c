"""The zoo's byte-level BPE tokenizer (``tokenizers``), saved as a transformers fast tokenizer so
``AutoTokenizer.from_pretrained(dir)`` loads it with its EOS and pad tokens set."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# 256 byte symbols + the two special tokens: below this BPE cannot cover every input
MIN_VOCAB_SIZE = 256 + 2


def train_tokenizer(texts: Sequence[str], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on ``texts``; ids 0 and 1 are EOS and pad. Deterministic for the same texts."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be >= {MIN_VOCAB_SIZE} (256 bytes + EOS + pad), got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    # no prefix space: "Answer:" then " <answer>" tokenises to a prefix of "Answer: <answer>"
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=model_max_length
    )


def encode_documents(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text with EOS appended: the model learns where an answer ends."""
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [ids + [tokenizer.eos_token_id] for ids in encoded]
