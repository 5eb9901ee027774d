"""rill-tiny-causal: a Voxtral-Realtime-architecture speech recognizer small enough to train on one CPU
core, trained from scratch on rill-tiny-speech's espeak-ng questions with word-timed delayed targets."""
