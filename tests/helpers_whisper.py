"""Random-weight Whisper directories made with transformers and saved as Hugging Face directories (no hub).

`make_whisper_dir(path, multilingual=..., num_mel_bins=..., max_source_positions=...)` writes what a real
Whisper checkpoint holds: config.json + model.safetensors (WhisperForConditionalGeneration), tokenizer.json +
tokenizer_config.json (a small ByteLevel BPE followed by Whisper's special tokens), generation_config.json
(the fields Whisper's `generate` reads) and preprocessor_config.json (WhisperFeatureExtractor, its window
`n_samples` matching `max_source_positions`: frames = 2 * max_source_positions, 100 frames a second).

Token layouts follow the real models: the BPE vocabulary, then <|endoftext|>, <|startoftranscript|>, the
language tokens, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nospeech|>,
<|notimestamps|>. English-only models (tiny.en) have one BPE token fewer and a generation config without
lang_to_id/task_to_id, so their prompt is <|startoftranscript|><|notimestamps|>; multilingual ones get
<|startoftranscript|><|lang|><|task|><|notimestamps|>, the language detected when not given.

`hf_features(path, audio)` and `hf_generate(path, features, ...)` are transformers' side: the oracle.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

LANGUAGES = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja"]
SPECIALS_BEFORE_LANGUAGES = ["<|endoftext|>", "<|startoftranscript|>"]
SPECIALS_AFTER_LANGUAGES = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                            "<|nospeech|>", "<|notimestamps|>"]
CORPUS = [
    "What is 347 plus 58? Reverse the word stream, please.",
    "What's the weather in Tokyo today? It is sunny and warm.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Count the letters in the word banana, then spell it backwards.",
    "Bonjour, ça va? Grüße aus Köln. Hola, ¿qué tal?",
    "你好，世界。こんにちは。",
]
# Sample rate and hop of every Whisper front end: 100 mel frames a second, two frames per encoder position.
SAMPLE_RATE = 16_000
POSITIONS_PER_SECOND = 50


def special_tokens() -> list[str]:
    return SPECIALS_BEFORE_LANGUAGES + [f"<|{lang}|>" for lang in LANGUAGES] + SPECIALS_AFTER_LANGUAGES


@lru_cache
def _tokenizer_json(bpe_vocab_size: int) -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    assert tok.get_vocab_size() == bpe_vocab_size, "the corpus is too small for this vocabulary size"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens()])
    return tok.to_str()


def whisper_tokenizer(multilingual: bool) -> Tokenizer:
    """Whisper's layout over a small BPE: English-only vocabularies are one BPE token shorter, as in OpenAI's."""
    return Tokenizer.from_str(_tokenizer_json(320 if multilingual else 319))


def _tokenizer_config(backend: Tokenizer) -> dict:
    decoder = {str(backend.token_to_id(t)): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                             "normalized": False, "single_word": False} for t in special_tokens()}
    return {"tokenizer_class": "WhisperTokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 1024,
            "added_tokens_decoder": decoder}


def generation_config(backend: Tokenizer, multilingual: bool, max_target_positions: int) -> dict:
    """Whisper's generation_config.json fields; suppress lists shaped like OpenAI's (symbols, then the task
    and start tokens, <|startofprev|> second to last as transformers expects)."""
    tid = backend.token_to_id
    eos = tid("<|endoftext|>")
    symbols = [i for t in ('"', "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "]", "|", "~")
               if (i := tid(t)) is not None]
    tail = ["<|translate|>", "<|transcribe|>", "<|startoftranscript|>", "<|startoflm|>", "<|startofprev|>",
            "<|nospeech|>"]
    cfg = {
        "decoder_start_token_id": tid("<|startoftranscript|>"), "bos_token_id": eos, "eos_token_id": eos,
        "pad_token_id": eos, "max_length": max_target_positions, "no_timestamps_token_id": tid("<|notimestamps|>"),
        "prev_sot_token_id": tid("<|startofprev|>"), "is_multilingual": multilingual,
        "suppress_tokens": symbols + [tid(t) for t in tail], "begin_suppress_tokens": [tid("Ġ"), eos],
        "forced_decoder_ids": None, "return_timestamps": False,
    }
    if multilingual:
        cfg["lang_to_id"] = {f"<|{lang}|>": tid(f"<|{lang}|>") for lang in LANGUAGES}
        cfg["task_to_id"] = {"translate": tid("<|translate|>"), "transcribe": tid("<|transcribe|>")}
    return cfg


SMALL = dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, decoder_layers=2, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128)


def make_whisper_dir(path: Path, *, multilingual: bool = True, num_mel_bins: int = 80, max_source_positions: int = 100,
                     max_target_positions: int = 48, seed: int = 0, init_std: float = 0.2,
                     eos_like: int | None = None, **overrides) -> Path:
    """Save a random WhisperForConditionalGeneration with its tokenizer, generation and preprocessor configs.

    max_source_positions must be a multiple of 50 (the feature extractor's window is whole seconds). A wider
    init than transformers' default keeps logits apart, so greedy argmax is not decided by float rounding.
    """
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    assert max_source_positions % POSITIONS_PER_SECOND == 0, "the feature extractor's window is whole seconds"
    path.mkdir(parents=True, exist_ok=True)
    backend = whisper_tokenizer(multilingual)
    backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(backend)))
    gen = generation_config(backend, multilingual, max_target_positions)
    eos, sot = gen["eos_token_id"], gen["decoder_start_token_id"]
    cfg = WhisperConfig(vocab_size=backend.get_vocab_size(), num_mel_bins=num_mel_bins,
                        max_source_positions=max_source_positions, max_target_positions=max_target_positions,
                        decoder_start_token_id=sot, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                        begin_suppress_tokens=None, suppress_tokens=None, init_std=init_std,
                        **{**SMALL, **overrides})
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(cfg)
    with torch.no_grad():
        if eos_like is not None:
            embed = model.model.decoder.embed_tokens.weight
            embed[eos] = 1.5 * embed[eos_like]
    model.save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps(gen, indent=1))
    WhisperFeatureExtractor(feature_size=num_mel_bins, chunk_length=max_source_positions // POSITIONS_PER_SECOND
                            ).save_pretrained(path)
    return path


def synthetic_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """A deterministic 16 kHz float32 signal with some structure (chirps + noise), not silence."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    freq = 200 + 300 * rng.random() + 150 * np.sin(2 * np.pi * (0.5 + rng.random()) * t)
    signal = 0.3 * np.sin(2 * np.pi * np.cumsum(freq) / SAMPLE_RATE) + 0.05 * rng.standard_normal(t.shape)
    return signal.astype(np.float32)


def hf_features(path: Path, audio: np.ndarray) -> torch.Tensor:
    """transformers' log-mel of one window: (1, num_mel_bins, 2 * max_source_positions)."""
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor.from_pretrained(path)
    return fe(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features


@lru_cache(maxsize=8)
def hf_model(path: Path):
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(path).eval()


def hf_prompt_ids(path: Path, prompt: str) -> list[int]:
    """WhisperTokenizer.get_prompt_ids: <|startofprev|> then " " + the stripped text."""
    from transformers import WhisperTokenizerFast

    return WhisperTokenizerFast.from_pretrained(path).get_prompt_ids(prompt).tolist()


def hf_generate(path: Path, features: torch.Tensor, language: str | None = None,
                prompt_ids: list[int] | None = None, **kwargs) -> list[int]:
    """transformers' greedy `generate` for one window: the whole decoder sequence (previous-text prompt,
    special tokens, output), a final EOS dropped."""
    model = hf_model(path)
    args = dict(language=language, **kwargs)
    if prompt_ids is not None:
        args["prompt_ids"] = torch.tensor(prompt_ids)
    with torch.inference_mode():
        out = model.generate(features, return_dict_in_generate=True, **args)
    ids = out["sequences"][0].tolist()
    return ids[:-1] if ids[-1] == model.generation_config.eos_token_id else ids
