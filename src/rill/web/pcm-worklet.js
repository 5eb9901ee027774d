// The microphone's samples, off the audio thread: each render quantum (128 frames at the
// AudioContext's rate) is posted to the page, which batches 100 ms into one append.
class PcmTap extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0]?.[0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}

registerProcessor("pcm-tap", PcmTap);
