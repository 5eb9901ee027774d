"""rill-tiny-causal's recipe: word-timed delayed targets, training that learns, a checkpoint rill's own
runtime streams and serves, and --init-from. espeak-ng says the clips; the model is the recipe's test shape."""

from __future__ import annotations

import io
import json
import random

import numpy as np
import openai
import pytest
import soundfile
import torch

from rill.tiny_speech import synth

if not hasattr(pytest.importorskip("transformers"), "VoxtralRealtimeConfig"):
    pytest.skip("transformers has no Voxtral Realtime (5.x needed)", allow_module_level=True)
if not synth.espeak_available():
    pytest.skip("espeak-ng is not installed", allow_module_level=True)

from helpers_server import one_torch_thread  # noqa: E402,F401
from helpers_voxtral import hf_transcribe  # noqa: E402
from test_voxtral_realtime_serving import llm_dir, voxtral_server  # noqa: E402,F401

from rill.speech.voxtral_realtime import VoxtralStream, load_voxtral_realtime  # noqa: E402
from rill.speech.whisper import speech_model_path  # noqa: E402
from rill.tiny_causal import model as M  # noqa: E402
from rill.tiny_causal import targets, timings, train  # noqa: E402
from rill.tiny_causal.vocab import NUM_SPECIAL, PAD, Vocab, subword_pieces, word_pieces  # noqa: E402

DELAY, N_LEFT = 6, train.N_LEFT


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("causal-cache")


@pytest.fixture(scope="module")
def data(cache):
    return timings.build(0, 8, train.MAX_SAMPLES, root=cache, size=8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache, data):
    out = tmp_path_factory.mktemp("causal") / "run"
    train.main(["--out", str(out), "--shape", "test", "--steps", "6", "--batch-size", "4", "--clips", "8",
                "--shard-size", "8", "--warmup", "2", "--cache-dir", str(cache), "--checkpoint-every", "3"])
    return out


def test_delayed_targets_start_a_delay_after_each_word_ends(data):
    vocab = Vocab(word_pieces(256))
    fits = set(train.fitting(data, vocab, DELAY).tolist())
    assert len(fits) >= len(data) // 2
    for i in range(len(data)):
        groups, ends, n = data.groups[i], data.ends[i], len(data.clips.audio(i))
        assert " ".join(groups) == data.clips.texts[i] and len(ends) == len(groups)
        assert ends == sorted(ends) and ends[-1] == n and 0 < ends[0] < n
        stream = targets.token_stream(vocab, groups, ends, n, DELAY, N_LEFT)
        if i not in fits:
            continue
        assert len(stream) == targets.num_frames(n, DELAY, N_LEFT)
        words = [t for t in stream if t != PAD][1:]
        assert vocab.decode(words) == " " + data.clips.texts[i]
        for group, end in zip(groups, ends):
            q = targets.first_index(end, DELAY, N_LEFT)
            # the position predicting index q has heard real frames up to q - 1 - n_left: the word's last
            # frame and `delay` more
            assert (q - 1 - N_LEFT) * targets.FRAME >= end - targets.FRAME + DELAY * targets.FRAME
            if q < len(stream) and stream[q] != PAD and vocab.decode([stream[q]]).strip():
                first = vocab.decode(vocab.encode(" " + group)[:1])
                assert vocab.decode([stream[q]]) == first or stream[q - 1] != PAD  # or it waited its turn
    # the word ends come from espeak-ng's own prefixes: not all at the end of the clip
    assert sum(len(e) for e in data.ends) > 2 * len(data)


def test_a_few_steps_lower_the_loss(data):
    torch.manual_seed(0)
    vocab = Vocab(word_pieces(256))
    model, extractor = M.create(vocab, "test")
    b = train.batch(data, train.fitting(data, vocab, DELAY)[:4, None], vocab, extractor, DELAY, np.random.default_rng(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = train.loss_of(model, b, DELAY, 3.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]  # 6.1 -> 4.5 at this seed


def test_questions_chained_in_one_stream_are_each_written_after_they_are_said(data):
    vocab = Vocab(word_pieces(256))
    a, b = (int(i) for i in train.fitting(data, vocab, DELAY)[:2])
    audio, groups, ends = train.presentation(data, [a, b], np.random.default_rng(0), clean_share=1.0)
    assert groups == data.groups[a] + data.groups[b]
    second, start = len(data.groups[a]), len(audio) - len(data.clips.audio(b))  # b's first group; b's start
    assert ends[second - 1] >= len(data.clips.audio(a)) and ends[-1] == len(audio)  # a's last group ends with a
    assert train.GAP_S[0] * 16_000 - 1 <= start - ends[second - 1] <= train.GAP_S[1] * 16_000
    said = audio[start:]  # b's own samples at the end, only scaled (no noise at clean_share 1)
    assert np.corrcoef(said, data.clips.audio(b))[0, 1] > 0.99
    assert np.abs(audio[ends[second - 1] : start]).max() == 0  # the gap is silence
    stream = targets.token_stream(vocab, groups, ends, len(audio), DELAY, N_LEFT)
    words = [t for t in stream if t != PAD][1:]
    assert vocab.decode(words) == " " + data.clips.texts[a] + " " + data.clips.texts[b]
    assert stream.index(vocab.encode(" " + groups[second])[0], targets.first_index(ends[second - 1], DELAY, N_LEFT)) \
        >= targets.first_index(ends[second], DELAY, N_LEFT)  # b's first word after it is said
    chained = train.batch(data, np.array([[a, b], [b, a]]), vocab, M.create(vocab, "test")[1], DELAY,
                          np.random.default_rng(0))
    assert chained["ids"].shape[0] == 2 and chained["ids"].shape[1] >= len(stream) - 1


def test_the_checkpoint_streams_as_it_decodes_offline(trained, data):
    audio = data.clips.audio(0)
    runtime = load_voxtral_realtime(trained)
    whole = VoxtralStream(runtime, 16_000)
    first, last = whole.feed(audio), whole.finish()
    pieces, stream = [], VoxtralStream(runtime, 16_000)
    for start in range(0, len(audio), 1000):
        pieces += stream.feed(audio[start : start + 1000]).token_ids
    pieces += stream.finish().token_ids
    assert pieces == first.token_ids + last.token_ids
    tokens, _, _ = hf_transcribe(trained, audio)  # transformers' offline generate on the same weights
    assert tokens[: len(pieces)] == pieces


async def test_the_checkpoint_serves_a_transcription(trained, data, llm_dir):  # noqa: F811
    audio = data.clips.audio(1)
    stream = VoxtralStream(load_voxtral_realtime(trained), 16_000)
    expected = (stream.feed(audio).text + stream.finish().text).strip()
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, 16_000, format="WAV", subtype="FLOAT")
    async with voxtral_server(llm_dir, trained) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        got = await client.audio.transcriptions.create(model=str(trained), file=("a.wav", buffer.getvalue()))
    assert got.text.strip() == expected


def test_init_from_continues_with_the_same_tokenizer(trained, cache, tmp_path):
    out = tmp_path / "next"
    train.main(["--out", str(out), "--init-from", str(trained), "--steps", "2", "--batch-size", "2", "--clips", "8",
                "--shard-size", "8", "--warmup", "1", "--cache-dir", str(cache), "--delay-ms", "160", "--chain", "2"])
    assert (out / "tekken.json").read_text() == (trained / "tekken.json").read_text()  # delay kept too
    assert json.loads((out / "train_state.json").read_text())["total_steps"] == 8
    before, after = M.load(trained)[0], M.load(out)[0]
    assert before.config.text_config.to_dict() == after.config.text_config.to_dict()
    assert any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))


def test_delays_ms_trains_at_several_delays_and_sets_the_default(trained, cache, tmp_path):
    """--delays-ms: each batch at one of the delays; the first becomes tekken.json's default (over the
    --init-from checkpoint's), and a stream at any of them decodes from the one checkpoint."""
    out = tmp_path / "delays"
    train.main(["--out", str(out), "--init-from", str(trained), "--steps", "4", "--batch-size", "2", "--clips", "8",
                "--shard-size", "8", "--warmup", "1", "--cache-dir", str(cache), "--delays-ms", "160,80"])
    assert json.loads((out / "tekken.json").read_text())["audio"]["transcription_delay_ms"] == 160
    assert json.loads((out / "train_state.json").read_text())["delays_ms"] == [160, 80]
    runtime = load_voxtral_realtime(out)
    assert VoxtralStream(runtime, 16_000).num_delay_tokens == 2
    assert VoxtralStream(runtime, 16_000, delay_ms=80).num_delay_tokens == 1


def test_eval_backend_takes_the_delay_and_refuses_a_bad_one(trained, data):
    """eval-tiny-causal --delay-ms: the held-out table at another delay is the stream's at that delay."""
    from rill.tiny_causal.evaluate import StreamBackend

    audio = data.clips.audio(2)
    stream = VoxtralStream(load_voxtral_realtime(trained), 16_000, delay_ms=160)
    expected = "".join([stream.feed(audio).text, stream.finish().text]).strip()
    assert StreamBackend(trained, 160).transcribe([audio]) == [expected]
    with pytest.raises(ValueError, match="multiple"):
        StreamBackend(trained, 100)


def test_eval_chain_gives_each_clip_what_the_one_stream_wrote_while_it_and_its_gap_went_in(data):
    """eval-tiny-causal --chain 2: one stream hears both clips; the first clip's text is what a stream fed
    it and its gap alone writes (the stream is causal), the second's all the rest, up to finish()."""
    from rill.tiny_causal.evaluate import CHAIN_GAP_S, PIECE, ChainBackend, StreamBackend, by_place

    shipped = speech_model_path("rill-tiny-causal")  # words to split: the test checkpoint writes none yet
    a, b = data.clips.audio(3), data.clips.audio(4)
    said = np.concatenate([a, np.zeros(int(CHAIN_GAP_S * 16_000), np.float32)])
    alone = VoxtralStream(load_voxtral_realtime(shipped), 16_000)
    first = "".join(alone.feed(said[at : at + PIECE]).text for at in range(0, len(said), PIECE)).strip()
    whole = VoxtralStream(load_voxtral_realtime(shipped), 16_000)
    everything = "".join([whole.feed(np.concatenate([said, b, said[len(a):]])).text, whole.finish().text])
    texts = ChainBackend(shipped, None, 2).transcribe([a, b, a])
    assert texts[0] == first and " ".join(texts[:2]).split() == everything.split()
    assert texts[0] and texts[1]
    assert texts[2] == StreamBackend(shipped).transcribe([a])[0]  # a chain of one left over: a stream of its own
    report = {"transcripts": [{"expected": "x y", "got": g} for g in ("x y", "", "X y.", "z")]}
    assert by_place(report, 2)["by_place"] == [{"n": 2, "correct": 2, "empty": 0}, {"n": 2, "correct": 0, "empty": 1}]


def test_merges_spell_fewer_tokens_and_keep_every_id(tmp_path):
    """--merges: subword pieces (byte-pair merges over what the word pieces leave spelled out) come after
    the word pieces, so every old id stays; word pieces still match whole words only, subword pieces
    anywhere; text round-trips and held-out questions take fewer tokens; tekken.json keeps the split."""
    from rill.tiny import splits
    from rill.tiny_speech import transcripts

    words = Vocab(word_pieces(256))
    merges = subword_pieces(words, 48, utterances=500)
    assert merges == subword_pieces(words, 48, utterances=500) and len(set(merges)) == 48
    assert any(m[:1] == b" " for m in merges)  # a spelled word's leading space merges too
    vocab = words.with_merges(merges)
    assert vocab.pieces[: len(words.pieces)] == words.pieces and vocab.num_subwords == 48
    assert vocab.num_word_pieces == words.num_word_pieces and vocab.size == words.size + 48
    rng = random.Random(3)
    texts = [" " + transcripts.make_utterance(rng, transcripts.sample_family(rng), splits.EVAL).text for _ in range(200)]
    assert all(vocab.decode(vocab.encode(t)) == t for t in texts)
    assert sum(len(vocab.encode(t)) for t in texts) < 0.85 * sum(len(words.encode(t)) for t in texts)
    piece = next(p for p in words.pieces[256:] if p[1:].isalpha())  # a word piece: " what"
    assert words.ids[piece] not in vocab.encode(piece.decode() + "zz")  # not inside a longer word
    assert vocab.encode(piece.decode()) == [words.ids[piece]]
    vocab.save(tmp_path, {})
    loaded = Vocab.load(tmp_path)
    assert loaded.pieces == vocab.pieces and loaded.num_word_pieces == vocab.num_word_pieces
    assert all(loaded.encode(t) == vocab.encode(t) for t in texts[:20])
    words.save(tmp_path, {})
    assert "rill_word_pieces" not in json.loads((tmp_path / "tekken.json").read_text())  # older files unchanged


def test_merges_grow_a_checkpoint_it_keeps_streaming(trained, cache, data, tmp_path):
    """--init-from with --merges: the embedding (tied with the output head) grows, the old rows kept and each
    new row the mean of its piece's bytes' rows; the checkpoint loads in rill's runtime and streams as it
    decodes whole; a second --merges on it is refused."""
    model, _, words = M.load(trained)
    before = model.get_input_embeddings().weight.detach().clone()
    vocab = words.with_merges(subword_pieces(words, 8, utterances=300))
    M.grow_vocab(model, words, vocab)
    after = model.get_input_embeddings().weight
    assert after.shape[0] == vocab.size == model.config.text_config.vocab_size
    assert model.get_output_embeddings().weight is after and torch.equal(after[: words.size], before)
    piece = vocab.pieces[-1]
    assert torch.allclose(after[vocab.ids[piece]], before[[NUM_SPECIAL + b for b in piece]].mean(0))

    out = tmp_path / "merged"
    train.main(["--out", str(out), "--init-from", str(trained), "--merges", "8", "--steps", "2", "--batch-size", "2",
                "--clips", "8", "--shard-size", "8", "--warmup", "1", "--cache-dir", str(cache)])
    grown = Vocab.load(out)
    assert grown.num_subwords == 8 and grown.pieces[: len(words.pieces)] == words.pieces
    runtime = load_voxtral_realtime(out)
    audio = data.clips.audio(0)
    whole = VoxtralStream(runtime, 16_000)
    tokens = whole.feed(audio).token_ids + whole.finish().token_ids
    stream, pieces = VoxtralStream(runtime, 16_000), []
    for start in range(0, len(audio), 1000):
        pieces += stream.feed(audio[start : start + 1000]).token_ids
    assert pieces + stream.finish().token_ids == tokens
    with pytest.raises(SystemExit, match="subword pieces already"):
        train.main(["--out", str(tmp_path / "again"), "--init-from", str(out), "--merges", "8", "--steps", "1",
                    "--clips", "8", "--shard-size", "8", "--cache-dir", str(cache)])


@pytest.mark.parametrize("bad", ["100", "0", "160,-80", ","])
def test_delays_ms_refuses_what_is_not_a_multiple_of_a_frame(bad):
    with pytest.raises(SystemExit):
        train.parse_args(["--delays-ms", bad])


async def test_the_shipped_weights_serve_by_name_and_hear_a_question(llm_dir):  # noqa: F811
    """`--speech-model rill-tiny-causal` serves the weights in the package; a question in a plain espeak-ng voice
    comes back word for word, and the server's transcript is the stream's."""
    from rill.speech.whisper import RILL_TINY_CAUSAL, speech_model_path
    from rill.tiny_speech import transcripts
    from rill.tiny_speech.voices import Voice

    audio = synth.synthesize(transcripts.spoken_form("What is rill?"), Voice("en-us", "", 160, 50, 100, 0))
    stream = VoxtralStream(load_voxtral_realtime(speech_model_path(RILL_TINY_CAUSAL)), 16_000)
    expected = (stream.feed(audio).text + stream.finish().text).strip()
    assert expected == "What is rill?"
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, 16_000, format="WAV", subtype="FLOAT")
    async with voxtral_server(llm_dir, RILL_TINY_CAUSAL) as (url, _):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert RILL_TINY_CAUSAL in [m.id async for m in client.models.list()]
        got = await client.audio.transcriptions.create(model=RILL_TINY_CAUSAL, file=("q.wav", buffer.getvalue()))
    assert got.text.strip() == expected


async def test_a_server_vad_turn_that_holds_no_words_is_committed_with_an_empty_transcript_and_not_answered(
        trained, data, llm_dir):  # noqa: F811
    """OpenAI's server_vad commits the buffer at every end of speech, so a client waits for each turn's
    item and transcript. The checkpoint of a few steps writes no words (a real model that has not learned
    to yet): the spoken question is still a turn, an item with an empty transcript, and is not answered."""
    from helpers_voice import of_type, silence, voice_client, voice_server

    audio = np.concatenate([silence(0.3), data.clips.audio(1), silence(1.5)])
    async with voice_server(llm_dir, trained) as server, voice_client(server) as client:
        await client.update(type="realtime", audio={"input": {"turn_detection": {"type": "server_vad"}}})
        await client.stream(audio, 0.1, float("inf"))
        events = await client.until("conversation.item.input_audio_transcription.completed")
        await client.send("conversation.item.retrieve", item_id=events[-1]["item_id"])  # a round trip: what the
        # turn set off comes before its answer
        events += await client.until("conversation.item.retrieved")
    item_id = of_type(events, "input_audio_buffer.speech_started")[0]["item_id"]
    assert of_type(events, "input_audio_buffer.speech_stopped")[0]["item_id"] == item_id
    assert of_type(events, "input_audio_buffer.committed")[0]["item_id"] == item_id
    completed = of_type(events, "conversation.item.input_audio_transcription.completed")
    assert [(c["item_id"], c["transcript"]) for c in completed] == [(item_id, "")]
    assert not of_type(events, "conversation.item.input_audio_transcription.delta")
    assert not of_type(events, "response.created") and not of_type(events, "error")
    assert events[-1]["item"]["content"][0]["transcript"] == ""
