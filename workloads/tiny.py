"""What a smoke makes instead of downloading, so that it needs nothing from the network:
tokenizers trained on the smoke's own text (WordPiece for BERT, byte-level BPE for GPT-2,
Unigram for T5, each wrapped as the model's transformers tokenizer and saved beside the tiny
model), and the tiny BERT both BERT smokes start from (bert-squad, bert-mrpc).

tokenizers and transformers are imported inside the functions, never at module import.
"""

from __future__ import annotations

import collections
import json
import math
from dataclasses import dataclass

from dsenv.workloads import runner


@dataclass(frozen=True)
class BertSettings(runner.Settings):
    """A workload's settings with the smoke's tiny BERT, built from a BertConfig."""

    vocab_size: int = 800  # WordPiece tokens (train_wordpiece)
    hidden_size: int = 64
    layers: int = 2
    heads: int = 2
    intermediate_size: int = 128
    dropout: float = 0.0
    init_range: float = 0.1  # BERT's 0.02 leaves a tiny model on a long plateau (measured)


def bert_config(s: BertSettings, tokenizer, max_positions: int, **extra):
    """The tiny BERT's BertConfig for ``tokenizer``'s vocabulary (``extra``: num_labels...)."""
    from transformers import BertConfig  # transformers: only once a run starts

    return BertConfig(vocab_size=len(tokenizer), hidden_size=s.hidden_size,
                      num_hidden_layers=s.layers, num_attention_heads=s.heads,
                      intermediate_size=s.intermediate_size,
                      max_position_embeddings=max_positions, hidden_dropout_prob=s.dropout,
                      attention_probs_dropout_prob=s.dropout, initializer_range=s.init_range,
                      **extra)


def train_wordpiece(texts: list[str], vocab_size: int):
    """A lower-casing WordPiece tokenizer trained here, as a transformers BertTokenizer."""
    # tokenizers: only once a run starts
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer  # transformers: only once a run starts

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wordpiece.train_from_iterator(texts, trainer)
    return BertTokenizer(vocab=wordpiece.get_vocab())


def train_byte_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained here (GPT-2's kind), as a GPT2Tokenizer."""
    # tokenizers: only once a run starts
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Tokenizer  # transformers: only once a run starts

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return GPT2Tokenizer(vocab=model["vocab"], merges=merges)


def train_unigram(texts: list[str], vocab_size: int):
    """A SentencePiece-style Unigram vocabulary estimated here (T5's kind), as a T5Tokenizer:
    <pad> 0 (also the decoder start), </s> 1 appended to every text, <unk> 2.

    The pieces are the corpus's most frequent words, marked "▁" at the word start as
    SentencePiece does, scored by their log frequency, plus every character seen (alone and
    word-initial) so that any text still encodes. tokenizers' UnigramTrainer is not used:
    on a corpus of ~300 distinct words it prunes down to sub-word fragments ("▁liv", "e",
    "s": measured), doubling the sequence length for nothing.
    """
    from transformers import T5Tokenizer  # transformers: only once a run starts

    words = collections.Counter(word for text in texts for word in text.split())
    chars = collections.Counter(ch for word, count in words.items() for ch in word
                                for _ in range(count))
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    singles = sorted({piece for ch in chars for piece in (ch, "\u2581" + ch)} | {"\u2581"})
    room = max(vocab_size - len(specials) - len(singles), 0)
    total = sum(words.values())
    pieces = [("\u2581" + word, math.log(count / total))
              for word, count in words.most_common(room) if len(word) > 1]
    floor = min((score for _, score in pieces), default=0.0) - 10.0  # characters: last resort
    pieces += [(piece, floor) for piece in singles]
    return T5Tokenizer(vocab=specials + pieces, extra_ids=0)
