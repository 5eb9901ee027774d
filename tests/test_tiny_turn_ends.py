"""rill-tiny's turn-ends phase (rill.tiny.turn_ends): what each token is trained for, and the loss."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rill.tiny import corpus
from rill.tiny.turn_ends import ASSISTANT, NONE, USER_ENDS, USER_GOES_ON, TurnEndEncoder, turn_end_loss

# A recipe test (a training loss on rill-tiny): CI's slow step, as the other recipes' heavier tests.
pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parent.parent / "src" / "rill" / "assets" / "rill-tiny"


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TINY / "tokenizer.json"))


def labelled(tokenizer, messages, tools=None) -> list[tuple[str, int]]:
    ids, labels = TurnEndEncoder(tokenizer).encode([corpus.Conversation(tuple(messages), tools and tuple(tools), ())])[0]
    return [(tokenizer.id_to_token(int(i)), int(label)) for i, label in zip(ids, labels)]


def test_user_words_train_only_the_end_of_turn_decision(tokenizer):
    tokens = labelled(tokenizer, [{"role": "user", "content": "Add 5 and 7."},
                                  {"role": "assistant", "content": "5 + 7 = 12"}])
    user = [label for _, label in tokens[:tokens.index(("<|im_end|>", USER_ENDS)) + 1]]
    # header and first word token: nothing; every later word token: "not over yet"; <|im_end|>: "over"
    assert user[-1] == USER_ENDS and user.count(USER_ENDS) == 1
    first_word = next(i for i, label in enumerate(user) if label == USER_GOES_ON) - 1
    assert tokens[first_word][0] == "A" and set(user[:first_word + 1]) == {NONE}
    assert set(user[first_word + 1:-1]) == {USER_GOES_ON}
    assert tokens[-1] == ("<|endoftext|>", NONE)
    assistant = [t for t, label in tokens if label == ASSISTANT]
    assert "".join(assistant).replace("Ġ", " ") == "5 + 7 = 12<|im_end|>"


def test_tool_results_and_system_turns_are_not_trained(tokenizer):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    tokens = labelled(tokenizer, [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny in Oslo."},
    ], [tool])
    assert sum(label == USER_ENDS for _, label in tokens) == 1  # the question's end, not the tool result's
    text = "".join(t for t, _ in tokens)
    result_at = text.index("<tool_response>")
    position, labels_after = 0, []
    for token, label in tokens:
        if position >= result_at and "</tool_response>" not in text[result_at:position]:
            labels_after.append(label)
        position += len(token)
    assert USER_GOES_ON not in labels_after and USER_ENDS not in labels_after


def test_the_loss_rewards_each_turns_end_and_nothing_before_it():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    model = transformers.MistralForCausalLM(config)
    rows = torch.tensor([[1, 4, 5, 6, 2, 7, 8, 2]])
    labels = torch.tensor([[NONE, NONE, USER_GOES_ON, USER_GOES_ON, USER_ENDS, ASSISTANT, ASSISTANT, ASSISTANT]],
                          dtype=torch.uint8)
    end = 2
    with torch.no_grad():
        loss = turn_end_loss(model, rows, labels, end, 1.0).item()
        logp = torch.log_softmax(model(rows[:, :-1]).logits[0].float(), -1)
    replay = -logp[4:7, rows[0, 5:8]].diagonal().mean()
    user = -logp[3, end] - torch.log1p(-logp[1:3, end].exp()).mean()  # ends after token 2; goes on before
    assistant = -logp[6, end] - torch.log1p(-logp[4:6, end].exp()).mean()  # its own <|im_end|> at the end
    expected = (replay + user + assistant).item()
    assert math.isclose(loss, expected, rel_tol=1e-4)
    assert np.isfinite(loss)
