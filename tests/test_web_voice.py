"""The web page's microphone in a real browser: headless Chromium with its fake audio capture fed an
espeak-ng WAV (`--use-file-for-fake-audio-capture`), against `rill serve` on 127.0.0.1 with a speech
model. The page's AudioWorklet taps the samples, sends PCM16 over /v1/realtime, shows the transcript
as it is recognised and the answer after the server's VAD ends the turn.

With a random-weight Whisper the transcript is gibberish, so that test pins the flow (a user message
that filled in while speaking, an answer with its stats, no console errors); with rill-tiny-speech
(skipped when this build lacks it) the spoken "What is twelve plus thirty?" is answered with 42.
Needs what tests/test_web_page.py needs (selenium, Debian's chromium and chromium-driver)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile

from helpers_browser import browser_requirements, chromium
from helpers_browser import rill_serve as serve_subprocess
from helpers_whisper import make_whisper_dir
from rill.speech.async_speech import speech_model_available

SERVE_TIMEOUT_S = 120
TURN_TIMEOUT_S = 90


_MISSING, pytestmark = browser_requirements(("espeak-ng", "espeak-ng"))

if _MISSING is None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait


def rill_serve(tmp_path: Path, *flags: str):
    """`rill serve` on a free port: yields its URL (helpers_browser.rill_serve)."""
    return serve_subprocess(tmp_path, *flags, timeout_s=SERVE_TIMEOUT_S)


def spoken_wav(path: Path, text: str) -> Path:
    """espeak-ng's speech with 0.5 s of silence before and 2 s after (the VAD's end of turn), 16 kHz."""
    from rill.tiny_speech.synth import synthesize
    from rill.tiny_speech.voices import Voice

    speech = synthesize(text, Voice("en-us", "", 150, 50, 100, 0))
    audio = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(32000, np.float32)])
    soundfile.write(path, audio, 16000, subtype="PCM_16")
    return path


def browser_hearing(wav: Path):
    """Chromium whose fake microphone plays `wav` once."""
    return chromium("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                    f"--use-file-for-fake-audio-capture={wav}%noloop", "--autoplay-policy=no-user-gesture-required")


def wait(browser, condition, what: str, timeout_s: float = TURN_TIMEOUT_S):
    return WebDriverWait(browser, timeout_s, poll_frequency=0.05).until(condition, f"waited {timeout_s} s for {what}")


def speak_to_the_page(url: str, wav: Path, llm: str) -> tuple[list[str], str, str, list[dict]]:
    """Open the page, pick `llm`, press Microphone; (user message texts seen, final user text, answer, stats,
    console errors) once the answer's stats line is there."""
    with browser_hearing(wav) as browser:
        browser.get(url)
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#model option[value='{llm}']"), "the model list")
        browser.execute_script(f"document.getElementById('model').value = {llm!r}")
        browser.find_element(By.ID, "mic").click()
        seen = []

        def user_text(d):
            nodes = d.find_elements(By.CSS_SELECTOR, "#log li.user .content")
            if nodes and nodes[-1].text and (not seen or seen[-1] != nodes[-1].text):
                seen.append(nodes[-1].text)
            return d.find_elements(By.CSS_SELECTOR, "#log li.assistant .stats")

        wait(browser, user_text, "the answer's stats line")
        assert browser.find_element(By.ID, "mic").get_attribute("aria-pressed") == "true"
        user = browser.find_element(By.CSS_SELECTOR, "#log li.user .content").text
        answer = browser.find_element(By.CSS_SELECTOR, "#log li.assistant .content").text
        stats = browser.find_element(By.CSS_SELECTOR, "#log li.assistant .stats").text
        browser.find_element(By.ID, "mic").click()  # stop listening
        assert browser.find_element(By.ID, "mic").get_attribute("aria-pressed") == "false"
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        shot = os.environ.get("RILL_WEB_VOICE_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
    return seen, user, answer + "\n" + stats, errors


def test_microphone_turn_is_transcribed_and_answered(tmp_path):
    speech_dir = make_whisper_dir(tmp_path / "whisper", multilingual=False, max_source_positions=250,
                                  max_target_positions=64)
    wav = spoken_wav(tmp_path / "question.wav", "What is twelve plus thirty?")
    with rill_serve(tmp_path, "--speech-model", str(speech_dir)) as url:
        seen, user, answer, errors = speak_to_the_page(url, wav, "rill-tiny")
    assert user and seen[-1] == user
    timed = re.search(r"first token (\d+) ms after you stopped speaking · (\d+ tokens/s · )?via voice, realtime",
                      answer)
    assert timed, answer
    # timed from the end of the speech, not from the speech_stopped event: the VAD's 500 ms of silence is inside
    assert int(timed.group(1)) >= 500, answer
    assert errors == []


@pytest.mark.skipif(not speech_model_available("rill-tiny-speech"), reason="rill-tiny-speech is not in this build")
def test_spoken_question_in_the_browser_is_answered_with_42(tmp_path):
    wav = spoken_wav(tmp_path / "question.wav", "What is twelve plus thirty?")
    with rill_serve(tmp_path) as url:
        seen, user, answer, errors = speak_to_the_page(url, wav, "rill-tiny")
    assert "12" in user and "30" in user, user
    assert "42" in answer, answer
    assert errors == []


@pytest.mark.skipif(not speech_model_available("rill-tiny-speech"), reason="rill-tiny-speech is not in this build")
def test_the_page_speaks_the_answer_in_the_voice_chosen(tmp_path):
    """Spoken answers (issue 51): with a voice chosen in the settings the page asks for audio, plays the
    answer's PCM16 as it arrives (Web Audio) and shows its transcript."""
    wav = spoken_wav(tmp_path / "question.wav", "What is twelve plus thirty?")
    with rill_serve(tmp_path) as url, browser_hearing(wav) as browser:  # rill serve has the espeak-ng voice
        browser.get(url)
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option[value='rill-tiny']"), "the models")
        browser.execute_script("document.getElementById('model').value = 'rill-tiny';"
                               "document.getElementById('voice-out').value = 'alloy';")
        browser.find_element(By.ID, "mic").click()
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#log li.assistant .stats"), "the answer's stats")
        answer = browser.find_element(By.CSS_SELECTOR, "#log li.assistant .content").text
        spoken_s = browser.execute_script("return window.rillVoiceOut.spokenSeconds")
        browser.find_element(By.ID, "mic").click()
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert "42" in answer, answer  # the transcript of what was said
    assert spoken_s > 0.5, spoken_s  # seconds of the answer's audio the page scheduled to play
    assert errors == []


@pytest.mark.skipif(not speech_model_available("rill-tiny-speech"), reason="rill-tiny-speech is not in this build")
def test_speaking_over_the_spoken_answer_stops_it_and_truncates_it(tmp_path):
    """The question, then (while its ~6 s answer plays) more speech: the page stops playback where it was and
    sends conversation.item.truncate with the milliseconds played, which the server takes."""
    from rill.tiny_speech.synth import synthesize
    from rill.tiny_speech.voices import Voice

    say = lambda text: synthesize(text, Voice("en-us", "", 150, 50, 100, 0))  # noqa: E731
    audio = np.concatenate([np.zeros(8000, np.float32), say("What is twelve plus thirty?"),
                            np.zeros(40000, np.float32), say("Wait, stop there please."), np.zeros(32000, np.float32)])
    wav = tmp_path / "barge-in.wav"
    soundfile.write(wav, audio, 16000, subtype="PCM_16")
    with rill_serve(tmp_path) as url, browser_hearing(wav) as browser:
        browser.get(url)
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#model option[value='rill-tiny']"), "the models")
        browser.execute_script("document.getElementById('model').value = 'rill-tiny';"
                               "document.getElementById('voice-out').value = 'echo';")
        browser.find_element(By.ID, "mic").click()
        cuts = wait(browser, lambda d: d.execute_script("return window.rillVoiceOut?.cuts.length && "
                                                        "window.rillVoiceOut.cuts"), "a cut in the answer's playback")
        truncated = wait(browser, lambda d: d.execute_script(
            f"return window.rillVoiceOut.truncated.includes({cuts[0]['playedMs']}) && window.rillVoiceOut.truncated"),
            "the server's conversation.item.truncated at the page's cut")
        spoken_s = browser.execute_script("return window.rillVoiceOut.spokenSeconds")
        browser.find_element(By.ID, "mic").click()
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    (cut,) = cuts
    assert 0 < cut["playedMs"] < 1000 * spoken_s, (cut, spoken_s)
    assert truncated[-1] == cut["playedMs"]  # the client's figure replaces the server's estimate
    assert errors == []
