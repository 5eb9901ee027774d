"""The clause splitter: boundaries only once certain, and the same clauses however the text is cut."""

import random

import pytest

from rill.tts.clauses import DEFAULT_MAX_CHARS, ClauseSplitter, split_text

CASES = [
    ("Hello there. How are you?", ["Hello there.", "How are you?"]),
    ("Yes. No! Maybe?", ["Yes.", "No!", "Maybe?"]),
    ("It costs 3.5 dollars. Fine.", ["It costs 3.5 dollars.", "Fine."]),
    ("Dr. Smith and Mr. Jones met St. Peter.", ["Dr. Smith and Mr. Jones met St. Peter."]),
    ("J. R. R. Tolkien wrote it. Then he slept.", ["J. R. R. Tolkien wrote it.", "Then he slept."]),
    ("Fruit, e.g. apples, is good for you.", ["Fruit, e.g. apples, is good for you."]),
    ("The U.S. Army is big. It is.", ["The U.S. Army is big.", "It is."]),
    ("It is 5 p.m. now.", ["It is 5 p.m. now."]),
    ("We saw a lot of birds etc. Then it rained.", ["We saw a lot of birds etc.", "Then it rained."]),
    ("We saw a lot of birds etc. and it rained.", ["We saw a lot of birds etc. and it rained."]),
    ('He said "no." Then he left.', ['He said "no."', "Then he left."]),
    ("Wait... what?!", ["Wait...", "what?!"]),
    ("See www.example.com now.", ["See www.example.com now."]),
    ("1,000 people came at 10:30 today.", ["1,000 people came at 10:30 today."]),
    # A clause mark ends a clause only once it holds min_words (4) words.
    ("Well, I think so.", ["Well, I think so."]),
    ("This is a long clause, and this is another one; plus a third: done.",
     ["This is a long clause,", "and this is another one;", "plus a third: done."]),
    ("This is the first part — and the second.", ["This is the first part —", "and the second."]),
    ("This is the first part - and the second.", ["This is the first part -", "and the second."]),
    ("Pages 1–2 of the book are – by far – best.", ["Pages 1–2 of the book are –", "by far – best."]),
    ("one two three four\nfive six", ["one two three four", "five six"]),
    ("one two\nthree", ["one two three"]),
    ("Title\n\nThe body of the text.", ["Title", "The body of the text."]),
    ("  lots   of\tspace  here.  ", ["lots of space here."]),
    ("no end at all", ["no end at all"]),
    ("...", []),
    ("", []),
    ("   \n ", []),
    ("— . , !", []),
]


@pytest.mark.parametrize(("text", "clauses"), CASES)
def test_split_text_cases(text, clauses):
    assert split_text(text) == clauses


@pytest.mark.parametrize(("text", "clauses"), CASES)
def test_char_by_char_gives_the_same_clauses(text, clauses):
    splitter = ClauseSplitter()
    out = []
    for ch in text:
        out += splitter.feed(ch)
    assert out + splitter.finish() == clauses


def test_random_pieces_give_the_same_clauses_as_whole():
    rng = random.Random(50)
    words = ["Dr.", "3.5", "etc.", "e.g.", "word", "the", "cat,", "dog;", "yes.", "No!", "why?", "—", "-",
             "U.S.", "A.", "10:30", "1,000", "\n", "\n\n", '"no."', "Then", "and", "x" * 30, "it:"]
    for _ in range(200):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(0, 60)))
        whole = split_text(text)
        splitter = ClauseSplitter()
        out, i = [], 0
        while i < len(text):
            step = rng.randint(1, 7)
            out += splitter.feed(text[i:i + step])
            i += step
        assert out + splitter.finish() == whole, text


def test_first_clause_goes_before_the_text_ends():
    splitter = ClauseSplitter()
    assert splitter.feed("Hello there") == []
    assert splitter.feed(".") == []  # "." then a digit would be a decimal: wait for one more character
    assert splitter.feed(" How") == ["Hello there."]
    assert splitter.pending() == "How"


def test_title_waits_for_nothing_but_maybe_end_waits_for_the_next_word():
    splitter = ClauseSplitter()
    assert splitter.feed("We bought pens etc. ") == []  # the next word decides
    assert splitter.feed("Then") == ["We bought pens etc."]


def test_run_on_text_is_cut_at_a_space_within_the_cap():
    text = " ".join(["word"] * 200)
    clauses = split_text(text)
    assert len(clauses) > 1
    assert all(len(c) <= DEFAULT_MAX_CHARS for c in clauses)
    assert " ".join(clauses) == text
    splitter = ClauseSplitter()
    first = []
    for ch in text:
        first = splitter.feed(ch)
        if first:
            break
    assert first and len(first[0]) <= DEFAULT_MAX_CHARS  # the first clause came before the text ended


def test_cap_at_and_past_the_limit():
    at = "a" * 20
    assert split_text(at, max_chars=20) == [at]  # exactly the cap: one clause
    past = "a" * 21
    assert split_text(past, max_chars=20) == ["a" * 20, "a"]  # one word past the cap is cut at the cap
    spaced = "aaaa " * 5  # 25 chars, spaces every 5
    assert split_text(spaced, max_chars=20) == ["aaaa aaaa aaaa aaaa", "aaaa"]


def test_min_words_is_a_parameter():
    assert split_text("Well, I think so.", min_words=1) == ["Well,", "I think so."]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        ClauseSplitter(min_words=0)
    with pytest.raises(ValueError):
        ClauseSplitter(max_chars=2)


def test_splitter_is_reusable_after_finish():
    splitter = ClauseSplitter()
    splitter.feed("First text")
    assert splitter.finish() == ["First text"]
    assert splitter.feed("Second. ") == ["Second."]
    assert splitter.finish() == []
