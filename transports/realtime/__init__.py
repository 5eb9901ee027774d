"""The realtime transport: OpenAI Realtime-style JSON events over a WebSocket.

From the wire inwards; each module imports only modules below it:

    quart_route   WS /v1/realtime on the HTTP port (quart-trio under hypercorn)
    ws_listener   the raw listener on its own port (`rill serve --ws-port`, trio-websocket)
    driver        what both listeners share: limits, admission (`RealtimeHub`), and the task that
                  pumps one socket through a `RealtimeConnection`
    speech_link   a connection's recogniser (rill.speech.live) in its nursery, events into its inbox
    connection    the protocol handler, sans-IO: client frames and engine deltas in, events out
    voice         speech in: the audio buffer's events and the recogniser's, into the user turn
    voice_settings  turn_detection and input transcription in session.update (beta and GA forms)
    conversation  session settings and conversation items, and how they become a prompt
    text_input    streamed text: the prompt split around the user message being streamed
    response      one response: engine deltas -> output items and their events
    audio_input   PCM16 input audio: decoding, resampling, caps, the audio front-end seam
    state         a connection's lifecycle as an enum and a transition table
    voice_events  the events of recognised speech (turn and transcription events)
    events        the protocol's events as msgspec structs (the wire vocabulary)
"""
