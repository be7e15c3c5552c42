"""Tiny random BERT encoders made on the spot, with a WordPiece tokenizer, and transformers'
embeddings of a padded batch: the reference the engine's vectors are compared with.

`save_tiny_bert` builds a transformers model and saves it HF-format; `write_wordpiece_tokenizer`
trains a BERT-style tokenizer.json ([CLS] text [SEP], lower-cased) on a small corpus.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig as HFBertConfig
from transformers import BertModel as HFBertModel
from transformers import PreTrainedModel

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a man is eating food while a woman plays the violin",
    "embeddings turn sentences into vectors that can be compared",
] * 10
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    initializer_range=0.2,
)


def write_wordpiece_tokenizer(path: Path, corpus: list[str] = CORPUS) -> HFTokenizer:
    """A BERT-style WordPiece tokenizer.json in `path`, with the padding and truncation a
    sentence-transformers export leaves in it (which the engine must not apply)."""
    tokenizer = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(corpus, trainers.WordPieceTrainer(special_tokens=SPECIALS))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer.enable_padding(length=16, pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=16)
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def save_tiny_bert(
    path: Path,
    *,
    model_class: type[PreTrainedModel] = HFBertModel,
    seed: int = 0,
    **overrides,
) -> PreTrainedModel:
    """A random model saved as safetensors in `path`, with a tokenizer whose vocabulary it
    covers; returns the model (float32, eval mode)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab_size = write_wordpiece_tokenizer(path).get_vocab_size()
    torch.manual_seed(seed)
    config = HFBertConfig(**{**TINY, "vocab_size": vocab_size, **overrides})
    model = model_class(config).eval()
    model.save_pretrained(path)
    return model


def padded_batch(token_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask of one right-padded batch, as a tokenizer would give."""
    longest = max(len(ids) for ids in token_ids)
    ids = torch.tensor([t + [0] * (longest - len(t)) for t in token_ids])
    mask = torch.tensor([[1] * len(t) + [0] * (longest - len(t)) for t in token_ids])
    return ids, mask


def hf_embeddings(
    model: HFBertModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mode: str = "mean",
    normalize: bool = True,
) -> torch.Tensor:
    """transformers' last_hidden_state of a padded batch, pooled over its real tokens the way
    sentence-transformers does ("mean" or "cls")."""
    with torch.no_grad():
        states = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if mode == "cls":
        pooled = states[:, 0]
    else:
        weights = attention_mask[..., None].to(states.dtype)
        pooled = (states * weights).sum(dim=1) / weights.sum(dim=1)
    return F.normalize(pooled, dim=-1) if normalize else pooled
