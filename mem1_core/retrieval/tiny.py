"""A tiny BERT-architecture encoder built from config, with a WordPiece tokenizer trained
on the given texts: a dense encoder that needs no download (tests, smoke runs). It is
saved as an ordinary Hugging Face model directory, so it loads through the same
`from_pretrained` path as a hub or local model. Its weights are random: it exercises the
dense code path; it does not retrieve well."""

from __future__ import annotations

import os
from pathlib import Path

# Special tokens of a BERT WordPiece vocabulary, in BERT's order.
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tiny_encoder(
    out_dir: str | os.PathLike,
    texts: list[str],
    *,
    vocab_size: int = 400,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 2,
    seed: int = 0,
) -> Path:
    """Write a random tiny BertModel and its tokenizer to `out_dir`; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    out = Path(out_dir)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        texts, WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(out)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=fast.vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden_size,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    BertModel(config).save_pretrained(out)
    return out
