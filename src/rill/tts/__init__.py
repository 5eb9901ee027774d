"""Speech out: text in (whole or in pieces), audio frames out, then encoded for the wire.

    backend.py     the contract every voice meets (espeak-ng's synthesizer, Kokoro's architecture)
    libespeak.py   libespeak-ng from the espeakng-loader wheel, loaded and initialised once, in-process
    clauses.py     text -> clauses, as text arrives: the voice starts at the first clause boundary
    stream_events.py  the messages of WS /v1/audio/speech/stream (vLLM-Omni's protocol), sans IO
    synthesizer.py the offline API: rill.Synthesizer(model).speak(text) and .stream(text_pieces)
    worker.py      the speech-out worker thread and its trio bridge (no model on the trio thread)
    audio_out.py   float32 frames -> wav / pcm / flac / mp3 / opus / aac, in pieces
"""
