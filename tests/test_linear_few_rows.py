"""models/linear.py: the few-rows CPU path of a decode step computes F.linear's product (to rounding),
only inside decode_step(True), only for 2-11 float32 rows; everywhere else it is F.linear bit for bit."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

from rill.models.linear import FEW_ROWS, Linear, decode_step


def layer(bias: bool) -> Linear:
    torch.manual_seed(0)
    lin = Linear(96, 200, bias=bias)
    with torch.no_grad():
        lin.weight.normal_()
        if bias:
            lin.bias.normal_()
    return lin


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [2, 3, 8, 11])
def test_decode_step_rows_equal_f_linear_to_rounding_and_are_contiguous(bias, rows):
    lin, x = layer(bias), torch.randn(rows, 96)
    with torch.inference_mode(), decode_step(True):
        y = lin(x)
    assert y.shape == (rows, 200) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-4)
    y.view(rows, 10, 20)  # callers split it by heads


@pytest.mark.parametrize("rows", [1, 12, 64])
def test_other_row_counts_are_f_linear_bit_for_bit_even_in_a_decode_step(rows):
    lin, x = layer(True), torch.randn(rows, 96)
    assert rows not in FEW_ROWS
    with torch.inference_mode(), decode_step(True):
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_outside_a_decode_step_few_rows_are_f_linear_bit_for_bit():
    # Prefill and mixed steps keep F.linear's numerics: a prompt sent in 9-token pieces computes
    # what the whole prompt computes (tests/test_engine.py pins that end to end).
    lin, x = layer(True), torch.randn(9, 96)
    with torch.inference_mode():
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
        with decode_step(False):
            assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))


def test_decode_step_is_scoped_to_its_thread_and_restored_on_exit():
    lin, x = layer(False), torch.randn(8, 96)
    seen = []

    def other_thread():
        seen.append(torch.equal(lin(x), F.linear(x, lin.weight)))

    with torch.inference_mode():
        with decode_step(True):
            with decode_step(False):
                assert torch.equal(lin(x), F.linear(x, lin.weight))
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        assert torch.equal(lin(x), F.linear(x, lin.weight))
    assert seen == [True]
