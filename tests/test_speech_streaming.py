"""LocalAgreement over scripted recogniser passes: what is committed, when, and that it stays.

No model here: each pass is a list of words with times, as a recogniser would return for the audio
window. `Speaker` scripts a long talk whose last, half-heard word comes out differently in every
pass, as Whisper's does at the edge of the audio.
"""

from __future__ import annotations

import pytest

from rill.speech.streaming import LocalAgreement, Word, common_prefix_len, ends_sentence

WORD_S = 0.4  # one word every 0.4 s (150 words a minute), each heard for 0.3 s


def words(text: str, start_s: float = 0.0) -> list[Word]:
    """`text`'s words, one every WORD_S seconds from `start_s`, Whisper-style leading spaces."""
    return [Word(" " + t, start_s + i * WORD_S, start_s + i * WORD_S + 0.3) for i, t in enumerate(text.split())]


def text_of(ws: list[Word]) -> str:
    return "".join(w.text for w in ws).strip()


class Speaker:
    """A talk of `num_words` words, a sentence every `sentence_words`; `pass_over` is what one
    recogniser pass hears of the window [window_start_s, audio_end_s]."""

    def __init__(self, num_words: int, sentence_words: int = 8):
        self.words = [Word(f" w{i}" + ("." if (i + 1) % sentence_words == 0 else ""), i * WORD_S, i * WORD_S + 0.3)
                      for i in range(num_words)]
        self.num_passes = 0

    def pass_over(self, window_start_s: float, audio_end_s: float) -> list[Word]:
        self.num_passes += 1
        heard = [w for w in self.words if w.start_s >= window_start_s and w.start_s < audio_end_s]
        if heard and heard[-1].end_s > audio_end_s:  # cut mid-word: a different guess every pass
            last = heard[-1]
            heard[-1] = Word(f" guess{self.num_passes}", last.start_s, audio_end_s)
        return heard


def stream(speaker: Speaker, policy: LocalAgreement, audio_end_s: float, step_s: float = 0.5):
    """Run passes every `step_s` up to `audio_end_s`, trimming as the policy says; yield per pass
    (audio_end_s, committed words)."""
    t = 0.0
    while t < audio_end_s:
        t = min(t + step_s, audio_end_s)
        committed = policy.insert(speaker.pass_over(policy.window_start_s, t))
        cut = policy.trim_point(t)
        if cut is not None:
            policy.trim(cut)
        yield t, committed


# -- the agreement itself ---------------------------------------------------------------------------


def test_one_pass_commits_nothing():
    policy = LocalAgreement()
    assert policy.insert(words("the cat sat on")) == []
    assert text_of(policy.unconfirmed) == "the cat sat on"


def test_two_passes_commit_their_longest_common_prefix():
    policy = LocalAgreement()
    policy.insert(words("the cat sat on"))
    assert text_of(policy.insert(words("the cat sat on the mat"))) == "the cat sat on"
    assert text_of(policy.unconfirmed) == "the mat"


def test_a_word_that_changes_between_passes_waits_for_the_next_agreement():
    policy = LocalAgreement()
    policy.insert(words("I scream"))
    assert policy.insert(words("ice cream for")) == []
    assert text_of(policy.insert(words("ice cream for all"))) == "ice cream for"


def test_committed_words_are_never_taken_back_by_a_later_pass():
    policy = LocalAgreement()
    policy.insert(words("ice cream for"))
    assert text_of(policy.insert(words("ice cream for all"))) == "ice cream for"
    # The same audio heard differently: the committed words stand, nothing is committed twice, and
    # the words after them go on agreeing with the pass before ("all" was left over from it).
    assert text_of(policy.insert(words("I scream for all of"))) == "all"
    assert text_of(policy.insert(words("I scream for all of us"))) == "of"
    assert policy.num_committed_words == 5


def test_punctuation_and_case_are_part_of_the_agreement():
    policy = LocalAgreement()
    policy.insert(words("hello there"))
    assert text_of(policy.insert(words("hello, there"))) == ""
    assert text_of(policy.insert(words("Hello, there friend"))) == ""
    assert text_of(policy.insert(words("Hello, there friend"))) == "Hello, there friend"


def test_a_repeated_committed_word_with_shifted_times_is_dropped_by_its_text():
    policy = LocalAgreement()
    policy.insert(words("sat on"))
    assert text_of(policy.insert(words("sat on the"))) == "sat on"
    # A pass that places "on" 0.25 s later than before, too late for the time filter: the text of the
    # committed tail drops it, so "the" agrees with the word left over from the pass before.
    shifted = [Word(" on", 0.65, 0.95)] + words("the mat", start_s=1.0)
    assert text_of(policy.insert(shifted)) == "the"
    assert text_of(policy.insert(shifted)) == "mat"


def test_agreement_of_three_needs_three_passes():
    policy = LocalAgreement(agree_n=3)
    policy.insert(words("one two"))
    assert policy.insert(words("one two three")) == []
    assert text_of(policy.insert(words("one two three four"))) == "one two"


def test_finish_commits_the_latest_pass_tail():
    policy = LocalAgreement()
    policy.insert(words("what is twelve"))
    assert text_of(policy.insert(words("what is twelve plus thirty"))) == "what is twelve"
    assert text_of(policy.finish()) == "plus thirty"
    assert policy.unconfirmed == [] and policy.finish() == []


def test_common_prefix_len_stops_at_the_first_difference_or_the_shortest():
    assert common_prefix_len([words("a b c"), words("a b d")]) == 2
    assert common_prefix_len([words("a b"), words("a b c")]) == 2
    assert common_prefix_len([[], words("a")]) == 0


@pytest.mark.parametrize("text, ends", [("mat.", True), ("why?", True), ('said."', True), ("Dr.", False),
                                        ("e.g.", False), ("3.5", False), ("well,", False)])
def test_sentence_ends_are_terminal_punctuation_not_abbreviations(text, ends):
    assert ends_sentence(Word(" " + text, 0.0, 0.3)) is ends


# -- a stream: every word once, in order, as soon as two passes agree --------------------------------


def test_a_stream_of_growing_passes_commits_each_word_once_in_order():
    speaker, policy = Speaker(40), LocalAgreement()
    committed = [w for _, ws in stream(speaker, policy, 40 * WORD_S) for w in ws] + policy.finish()
    assert [w.text for w in committed] == [w.text for w in speaker.words]


def test_committed_words_lag_the_speech_by_about_two_passes():
    speaker, policy = Speaker(40), LocalAgreement()
    lags = [t - w.end_s for t, ws in stream(speaker, policy, 40 * WORD_S, step_s=0.5) for w in ws]
    assert max(lags) <= 2 * 0.5 + WORD_S


# -- the window: trimmed at committed sentence ends, bounded however long the stream --------------------


def test_no_trim_while_the_window_is_shorter_than_trim_after_s():
    policy = LocalAgreement(trim_after_s=15.0)
    policy.insert(words("It is late."))
    policy.insert(words("It is late. Go"))
    assert policy.trim_point(audio_end_s=10.0) is None


def test_trim_point_is_the_end_of_the_last_committed_sentence():
    policy = LocalAgreement(trim_after_s=2.0)
    policy.insert(words("It is late. Go home now"))
    committed = policy.insert(words("It is late. Go home now please"))
    assert text_of(committed) == "It is late. Go home now"
    assert policy.trim_point(audio_end_s=3.0) == committed[2].end_s


def test_trimmed_sentences_move_to_the_prompt_and_later_passes_continue():
    policy = LocalAgreement(trim_after_s=2.0)
    policy.insert(words("It is late. Go"))
    policy.insert(words("It is late. Go home"))
    cut = policy.trim_point(audio_end_s=2.5)
    policy.trim(cut)
    assert policy.prompt == " It is late." and policy.window_start_s == cut
    rest = words("Go home now", start_s=3 * WORD_S)  # a pass over the trimmed window, "Go" included
    assert text_of(policy.insert(rest)) == "home"  # agrees with the word left over before the cut
    assert text_of(policy.insert(rest)) == "now"


def test_a_window_with_no_sentence_end_is_cut_at_the_last_committed_word_past_max_window():
    policy = LocalAgreement(trim_after_s=5.0, max_window_s=8.0)
    talk = words(" ".join(["on"] + [f"and{i}" for i in range(24)]))  # 10 s, no full stop
    policy.insert(talk[:-1])
    policy.insert(talk)
    assert policy.trim_point(audio_end_s=7.0) is None
    assert policy.trim_point(audio_end_s=10.0) == talk[-2].end_s


def test_silence_past_max_window_is_cut_to_trim_after_s():
    policy = LocalAgreement(trim_after_s=5.0, max_window_s=8.0)
    policy.insert([])
    policy.insert([])
    assert policy.trim_point(audio_end_s=9.0) == 4.0


def test_an_hour_of_speech_keeps_the_window_and_the_state_bounded():
    hour_s = 3600.0
    speaker = Speaker(int(hour_s / WORD_S))
    policy = LocalAgreement(trim_after_s=15.0, max_window_s=25.0)
    num_words, widest_s = 0, 0.0
    for t, committed in stream(speaker, policy, hour_s, step_s=1.0):
        num_words += len(committed)
        widest_s = max(widest_s, t - policy.window_start_s)
        assert len(policy.prompt) <= policy.max_prompt_chars
    num_words += len(policy.finish())
    assert num_words == len(speaker.words) == policy.num_committed_words
    assert widest_s <= policy.trim_after_s + 1.0
    assert policy.num_words_in_window <= policy.max_window_s / WORD_S
