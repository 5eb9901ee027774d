"""VoxtralStream: audio chunks in, text tokens and text deltas out, as the audio arrives.

The stream is what mistral-common's streaming transcription request asks of the model: `n_left` frames
of silence, then the audio; the prompt is BOS and `n_left + delay` streaming pads, one per frame, so the
first token is sampled once `delay + 1` frames of real audio are heard; after that each 80 ms frame runs
one decoder position (the token sampled at the last position plus this frame's audio embedding) and
samples the next token. Text thus lags its audio by the delay.

`finish()` pads as mistral-common pads a whole clip (to a whole frame, then `delay + 1 + 10` frames of
silence) and stops where transformers' `generate` stops on that clip: after the next-to-last frame (it
generates `frames - prompt` tokens), or at the end-of-sequence token. So a clip fed in any pieces gives
the tokens `generate` gives on the whole clip.

`early_stop` ends a finished stream sooner, with the same text: in Delayed Streams Modeling a word's
tokens start `delay` frames after its last frame and follow one a frame, so a streaming pad sampled once
the decoder has heard the audio's end plus the delay plus a frame (`stop_position`) means no word is in
flight and none can start: the rest of the padding would be pads. Off by default (transformers' parity:
random weights write words anywhere); `rill serve` turns it on.

Two ways to drive it: `feed` / `finish` (one stream alone, KyutaiStream's interface), or `push` / `end`
queue audio and `advance` runs it, with `pop_delta` taking what came out (rill.speech.causal's
CausalStream, what the speech worker's live streams run).

A stream's state is bounded whatever its length: fewer than n_fft samples in the front end, a few conv
columns, each attention layer's last window - 1 keys and values (encoder and decoder), fewer than 4
encoder positions waiting for their frame, frames not yet run (only before the prompt is whole), audio
queued and not yet advanced, the last token and an incremental UTF-8 decoder.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from rill.speech.kyutai.resample import StreamResampler
from rill.speech.kyutai.stream import StreamDelta
from rill.speech.voxtral_realtime.features import MelStream
from rill.speech.voxtral_realtime.loader import VoxtralRuntime

# mistral-common's OFFLINE_STREAMING_BUFFER_TOKENS: frames of silence after the delay's, so that the
# last word spoken has room to come out.
RIGHT_PAD_BUFFER_FRAMES = 10


class VoxtralStream:
    """One live stream over a shared VoxtralRuntime. Not thread-safe; one per audio source.

    `delay_ms`: the transcription delay, a positive multiple of 80 ms (default: tekken.json's).
    """

    def __init__(self, runtime: VoxtralRuntime, input_rate: int | None = None, *, delay_ms: float | None = None,
                 keep_logits: bool = False, early_stop: bool = False):
        self.runtime = runtime
        self.early_stop = early_stop
        audio, tok = runtime.audio, runtime.tokenizer
        self.input_rate = input_rate or audio.sampling_rate
        self.num_delay_tokens = audio.num_delay_tokens(delay_ms)
        self.prompt = [tok.bos_id] + [tok.streaming_pad_id] * (audio.num_left_pad_tokens + self.num_delay_tokens)
        self._resampler = StreamResampler(self.input_rate, audio.sampling_rate)
        # mistral-common's left padding: silence before the audio, queued with it.
        self._queue = np.zeros(audio.num_left_pad_tokens * audio.frame_samples, np.float32)
        self._mel = MelStream(runtime.front)
        self._encoder = runtime.model.audio_tower.new_state()
        self._decoder = runtime.model.language_model.new_state(self.num_delay_tokens)
        self._frames = torch.zeros(1, 0, runtime.spec.decoder.hidden_size, device=runtime.device)
        self._utf8 = tok.incremental_decoder()
        self._last_token: int | None = None  # sampled at the last position, fed at the next
        self._new_tokens: list[int] = []  # sampled since the last pop_delta, and their text
        self._new_pieces: list[str] = []
        self.logits: list[torch.Tensor] | None = [] if keep_logits else None  # for parity tests only
        self.num_audio_samples = 0  # samples of the caller's audio at the model's rate (no padding)
        self.ended = False  # no more audio (end() or finish())
        self.finished = False  # ended and every position run: the last delta is out or waiting
        self.at_eos = False  # the model wrote its end-of-sequence token: nothing more comes out
        self._final = False  # ended, and the last of the audio taken
        self._limit: int | None = None  # positions generate() runs in all, once the end is known
        self.stopped_early = False  # early_stop ended it: the padding left is dropped unrun
        self._num_taken = 0  # samples taken off the queue (the left padding included)

    @property
    def num_positions(self) -> int:
        return self._decoder.num_positions

    num_steps = num_positions  # rill.speech.causal's name: position p's token heard audio up to
    # (p + 1) * 80 ms less the left padding

    @property
    def num_state_bytes(self) -> int:
        """What this stream holds of its own (the caches and buffers; the model is shared)."""
        kv = [t for st in (self._encoder, self._decoder) for layer in st.layers for t in (layer.k, layer.v)
              if t is not None]
        tensors = kv + [self._frames, self._encoder.conv1, self._encoder.conv2]
        tensors += [self._encoder.waiting] if self._encoder.waiting is not None else []
        return sum(t.numel() * t.element_size() for t in tensors) + self._mel._buffer.nbytes + self._queue.nbytes

    @property
    def stop_position(self) -> int | None:
        """Once ended: the first position whose streaming pad ends the stream under early_stop. The last
        word's first token comes at position `n_left + audio frames + delay - 1` at the latest (its frame
        heard plus the delay); one frame more is the margin."""
        if not self.ended:
            return None
        frame = self.runtime.audio.frame_samples
        num_frames = self.runtime.audio.num_left_pad_tokens + -(-self.num_audio_samples // frame)
        return num_frames + self.num_delay_tokens

    def _frame_limit(self, max_frames: int | None) -> int | None:
        """Under early_stop an ended stream takes the frames up to its stop position at once (one worker
        step rather than several of `max_frames`, and alone no padding past it), plus one for the front
        end's look-ahead; past the stop without a pad, the rest as asked."""
        if not (self.early_stop and self.ended):
            return max_frames
        frame = self.runtime.audio.frame_samples
        to_stop = -(-((self.stop_position + 1) * frame - self._num_taken) // frame) + 1
        if to_stop <= 1:
            return max_frames
        return to_stop if max_frames is None else max(max_frames, to_stop)

    @property
    def decoder_state(self):
        return self._decoder

    @property
    def audio_s(self) -> float:
        return self.num_audio_samples / self.runtime.audio.sampling_rate

    # -- one stream alone: feed / finish --------------------------------------------------------------

    def feed(self, pcm: np.ndarray) -> StreamDelta:
        """Mono float samples at `input_rate`, any length: returns the tokens that whole frames allow."""
        if self.ended:
            raise RuntimeError("the stream is finished")
        self.push(pcm)
        self.advance()
        return self.pop_delta()

    def finish(self) -> StreamDelta:
        """End of audio: flush the resampler, pad with silence, run the last positions, flush the text."""
        if self.finished:
            return StreamDelta([], "")
        self.end()
        self.advance()
        return self.pop_delta()

    # -- the parts the speech worker's live streams run (rill.speech.causal) ---------------------------

    def push(self, pcm: np.ndarray) -> None:
        """Queue mono float samples at `input_rate` (resampled to the model's rate as they come)."""
        samples = self._resampler.push(np.asarray(pcm, dtype=np.float32), last=False)
        self.num_audio_samples += samples.size
        self._queue = np.concatenate([self._queue, samples])

    def end(self) -> None:
        """No more audio: the resampler's tail, then mistral-common's right padding, are queued."""
        if self.ended:
            return
        tail = self._resampler.push(np.zeros(0, dtype=np.float32), last=True)
        self.num_audio_samples += tail.size
        frame = self.runtime.audio.frame_samples
        pad = -self.num_audio_samples % frame + frame * (self.num_delay_tokens + 1 + RIGHT_PAD_BUFFER_FRAMES)
        self._queue = np.concatenate([self._queue, tail, np.zeros(pad, np.float32)])
        self.ended = True

    @property
    def num_ready_frames(self) -> int:
        """Frames of audio queued (a part of one counts: its mel frames can run)."""
        return -(-self._queue.size // self.runtime.audio.frame_samples)

    def advance(self, max_frames: int | None = None) -> None:
        """Run up to `max_frames` frames of the queued audio (all of it by default) through the model."""
        while True:
            self.prepare(max_frames)
            while self.wants_step:
                token, audio = self.step_inputs()
                hidden = self.runtime.model.language_model(torch.tensor([[token]], device=self.runtime.device),
                                                           audio, self._decoder)
                self.take_hidden(hidden[:, -1])
            self.settle()
            # all of it: under early_stop the end's padding comes in two parts, up to the stop and the rest
            if max_frames is not None or self.finished or self.at_eos or not self._queue.size:
                return

    def prepare(self, max_frames: int | None = None) -> None:
        """Take up to `max_frames` frames of queued audio through the front end and the encoder, and run
        the prompt's positions their frames allow (alone: their tokens are known, several at once)."""
        mel = self.take_mel(max_frames)
        if mel is not None:
            self.take_encoded(self.runtime.model.audio_tower.stream(mel, self._encoder))
        self.run_prompt()

    # prepare's three parts, apart so that VoxtralCausal runs the encoder of several streams as one batch

    def take_mel(self, max_frames: int | None = None) -> torch.Tensor | None:
        """Up to `max_frames` frames of queued audio through the front end: log-mel frames [1, n_mels, T]
        for the encoder (`encoder_state`), or None when none is complete."""
        if self.finished:
            return None
        max_frames = self._frame_limit(max_frames)
        size = self._queue.size if max_frames is None else max_frames * self.runtime.audio.frame_samples
        samples, self._queue = self._queue[:size], self._queue[size:]
        self._num_taken += samples.size
        self._final = self.ended and not self._queue.size
        if self.at_eos:
            return None
        mels = [self._mel.push(samples)] + ([self._mel.finish()] if self._final else [])
        if self._final:  # generate() runs every position but the last frame's
            self._limit = self._mel.num_samples // self.runtime.audio.frame_samples - 1
        mels = [m for m in mels if m is not None]
        return torch.cat(mels, dim=1)[None] if mels else None

    @property
    def encoder_state(self):
        return self._encoder

    def take_encoded(self, frames: torch.Tensor, projected: bool = False) -> None:
        """The encoder's completed frames [1, F, factor * D_enc] (or already projected, [1, F, D])."""
        if frames.shape[1]:
            if not projected:
                with torch.inference_mode():
                    frames = self.runtime.model.multi_modal_projector(frames)
            self._frames = torch.cat([self._frames, frames.float()], dim=1)

    def run_prompt(self) -> None:
        """The prompt's positions that the frames so far allow (their tokens are known: several at once)."""
        if self.finished or self.at_eos:
            return
        start, num_prompt = self.num_positions, len(self.prompt)
        count = min(self._frames.shape[1], num_prompt - start, self._room)
        if count > 0:
            hidden = self._run(self.prompt[start : start + count], count)
            if self.num_positions == num_prompt:
                self.take_hidden(hidden[:, -1])

    @property
    def wants_step(self) -> bool:
        """A position past the prompt whose frame has arrived, before the end."""
        return (bool(self._frames.shape[1]) and self.num_positions >= len(self.prompt) and not self.at_eos
                and not self.stopped_early and self._room > 0)

    @property
    def _room(self) -> int:
        """Positions still to run: unbounded until the end is known."""
        return sys.maxsize if self._limit is None else self._limit - self.num_positions

    def step_inputs(self) -> tuple[int, torch.Tensor]:
        """The next position's token (sampled at the last) and its frame's audio embedding [1, 1, D]."""
        audio, self._frames = self._frames[:, :1], self._frames[:, 1:]
        return self._last_token, audio

    def take_hidden(self, hidden: torch.Tensor) -> None:
        """The last position's final hidden state [1, D]: its greedy token is the stream's next."""
        with torch.inference_mode():
            self.take_logits(self.runtime.model.lm_head(hidden)[0].float())

    def take_logits(self, logits: torch.Tensor) -> None:
        if self.logits is not None:
            self.logits.append(logits)
        token = self._last_token = int(logits.argmax())
        self.at_eos = token == self.runtime.tokenizer.eos_id
        if self.early_stop and token == self.runtime.tokenizer.streaming_pad_id and self.ended:
            self.stopped_early = self.num_positions - 1 >= self.stop_position
        self._new_tokens.append(token)
        self._new_pieces.append(self._utf8.decode(self.runtime.tokenizer.pieces[token]))

    def settle(self) -> None:
        """After a step's positions: an ended stream whose audio is all run (or stopped early) is finished."""
        self._final = self._final or self.stopped_early
        if self.finished or not (self._final or self.at_eos):
            return
        self._queue, self._frames = self._queue[:0], self._frames[:, :0]
        if self._final:
            held = self._utf8.decode(b"", final=True)  # an unfinished character's bytes, as U+FFFD
            if held:
                self._new_pieces[-1:] = [(self._new_pieces[-1] if self._new_pieces else "") + held]
            self.finished = True

    def pop_delta(self) -> StreamDelta:
        """The tokens sampled since the last call, and the text each adds."""
        tokens, pieces = self._new_tokens, self._new_pieces
        self._new_tokens, self._new_pieces = [], []
        return StreamDelta(tokens, "".join(pieces), pieces)

    def _run(self, ids: list[int], count: int) -> torch.Tensor:
        audio, self._frames = self._frames[:, :count], self._frames[:, count:]
        tokens = torch.tensor([ids], device=self.runtime.device)
        return self.runtime.model.language_model(tokens, audio, self._decoder)
