// Speaker: a spoken answer (PCM16 at 24 kHz from response.output_audio.delta) played as it arrives with
// Web Audio, each piece scheduled right after the one before; and how much of it has been heard, so that a
// barge-in can stop playback and tell the server where (conversation.item.truncate's audio_end_ms).

const RATE_HZ = 24000;

/** base64 PCM16 little-endian -> float samples in [-1, 1). */
export function pcm16Samples(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const samples = new Float32Array(bytes.length >> 1);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
  return samples;
}

export class Speaker {
  constructor() {
    this.context = null;
    this.sources = new Set();
    this.itemId = null;  // the assistant item being played
    this.itemStart = 0;  // the context time its first sample plays at
    this.endAt = 0;  // the context time the audio scheduled so far ends at
    this.receivedSeconds = 0;  // all audio received (window.rillVoiceOut shows it, and the cuts, to tests)
    window.rillVoiceOut = { spokenSeconds: 0, cuts: [], truncated: [] };
  }

  /** Create the AudioContext within the user's gesture (the microphone button), so that it may play. */
  open() {
    this.context ??= new AudioContext({ sampleRate: RATE_HZ });
  }

  play(itemId, base64) {
    this.open();
    const samples = pcm16Samples(base64);
    if (!samples.length) return;
    const buffer = this.context.createBuffer(1, samples.length, RATE_HZ);
    buffer.copyToChannel(samples, 0);
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const at = Math.max(this.context.currentTime, this.endAt);
    if (itemId !== this.itemId) {
      this.itemId = itemId;
      this.itemStart = at;
    }
    source.start(at);
    source.onended = () => this.sources.delete(source);
    this.sources.add(source);
    this.endAt = at + buffer.duration;
    this.receivedSeconds += buffer.duration;
    window.rillVoiceOut.spokenSeconds = this.receivedSeconds;
  }

  /** Stop playback: {itemId, playedMs} of an answer cut short, or null when all of it had been played. */
  stop() {
    const { context, itemId } = this;
    if (!context || itemId === null) return null;
    const now = context.currentTime;
    const cut = now < this.endAt ? { itemId, playedMs: Math.max(0, Math.floor((now - this.itemStart) * 1000)) } : null;
    if (cut) window.rillVoiceOut.cuts.push(cut);
    this.sources.forEach((source) => source.stop());
    this.sources.clear();
    this.itemId = null;
    this.endAt = now;
    return cut;
  }

  close() {
    this.stop();
    this.context?.close();
    this.context = null;
  }
}
