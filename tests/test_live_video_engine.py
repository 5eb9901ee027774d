"""Live video in the engine: a clip appended a piece (two frames) at a time to a streaming session, with
the question appended after it, answers token for token as the whole clip and question sent at once
(M-RoPE laid out as one video; text after it where the whole prompt puts it), and transformers agrees;
a rebase (frames left out of the context) prefills the shorter context beside the live one, takes
effect once it caught up, and answers as that shorter prompt sent whole; the KV and the encoder cache
hold nothing once the session ends or is aborted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers_vision import hf_inputs, hf_vl_model, make_vl_model_dir, noise_clip
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.live_video.context import LiveContext
from rill.live_video.framing import PieceMaker, video_framing
from rill.multimodal.qwen2_vl_inputs import VideoClip
from rill.sampling_params import SamplingParams

torch.set_num_threads(1)
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
QUESTION = "How many times did the red light flash?"


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def model_dir(request, tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp(request.param), request.param)


def _core(model_dir, **kw) -> EngineCore:
    return EngineCore(EngineConfig(model=str(model_dir), **{"max_num_seqs": 8, **kw}))


def _frames(n: int, seed: int = 0) -> list[np.ndarray]:
    return [np.asarray(im) for im in noise_clip(n, 84, 56, seed)]  # 5 pieces of 2x3 merged tokens: T > max(h, w)


def _whole(core: EngineCore, frames, question=QUESTION):
    """The clip and the question as one request: the chat template over [video, text], expanded."""
    content = [{"type": "video"}, {"type": "text", "text": question}]
    text = core.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    ids = core.tokenizer.encode(text, add_special_tokens=False)
    return core.mm_inputs.expand(ids, [core.mm_inputs.item("video", VideoClip(np.stack(frames), 2.0))])


def _split_whole(core: EngineCore, ids: list[int]):
    """(ids before the video, ids after it): the session's opening prompt, and what ends it."""
    framing = video_framing(core.tokenizer, core.mm_inputs)
    start = ids.index(framing.pad_id) - len(framing.open_ids)
    end = len(ids) - ids[::-1].index(framing.pad_id) + len(framing.close_ids)
    return ids[:start], ids[end:], framing


def _drain(core: EngineCore) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while core.has_work or core._pending:
        for d in core.step():
            out.setdefault(d.request_id, []).extend(d.token_ids)
    return out


def _stream(core: EngineCore, rid: str, frames, steps_between: int = 8) -> LiveContext:
    """Open a session and append the frames a piece at a time, stepping the engine in between."""
    ids, _ = _whole(core, frames)
    prefix, _, framing = _split_whole(core, ids)
    maker = PieceMaker(core.mm_inputs, fps=2.0)
    context = LiveContext(framing)
    context.add_text(prefix)
    core.open_session(rid, GREEDY, prompt_token_ids=prefix)
    for k in range(0, len(frames), 2):
        piece_ids, items = context.add_piece(maker.piece(frames[k:k + 2], frames[0].shape[:2]))
        core.append_input(rid, piece_ids, items)
        for _ in range(steps_between):
            core.step()
    return context


def _end(core: EngineCore, rid: str, context: LiveContext, frames) -> None:
    ids, _ = _whole(core, frames)
    _, suffix, _ = _split_whole(core, ids)
    core.append_input(rid, context.close_video() + suffix)
    core.finish_input(rid)


def _assert_nothing_held(core: EngineCore) -> None:
    cache = core.scheduler.vision.cache
    assert cache.num_holders == 0
    cache.check_invariants()
    core.block_manager.check_invariants()
    assert core.block_manager.num_used_blocks == 0
    assert not core.live.seqs and not core.live.shadows and not core.requests


def test_a_clip_streamed_a_piece_at_a_time_answers_as_the_whole_clip(model_dir):
    frames = _frames(10)
    whole = _core(model_dir, enable_prefix_caching=False)
    ids, items = _whole(whole, frames)
    whole.add_request("w", ids, GREEDY, items)
    expected = _drain(whole)["w"]
    core = _core(model_dir, enable_prefix_caching=False, max_num_batched_tokens=16)  # pieces split over steps
    context = _stream(core, "s", frames)
    live_ids = context.prompt()[0]
    assert live_ids == ids[: len(live_ids)]  # the whole prompt up to the video's last placeholder
    _end(core, "s", context, frames)
    assert _drain(core)["s"] == expected
    _assert_nothing_held(core)


def test_transformers_agrees_with_the_whole_clip(model_dir):
    frames = _frames(6, seed=3)
    core = _core(model_dir)
    ids, items = _whole(core, frames)
    core.add_request("w", ids, GREEDY, items)
    ours = _drain(core)["w"]
    hf = hf_vl_model(model_dir)
    vision = core.mm_inputs.vision
    inputs = hf_inputs(ids, items, vision.image_token_id, vision.video_token_id,
                       fps=2.0 if vision.version == 25 else None)
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert ours == out[0, len(ids):].tolist()


def test_an_odd_last_frame_is_its_own_piece(model_dir):
    frames = _frames(7, seed=1)
    whole = _core(model_dir)
    ids, items = _whole(whole, frames)
    whole.add_request("w", ids, GREEDY, items)
    expected = _drain(whole)["w"]
    core = _core(model_dir)
    context = _stream(core, "s", frames)
    assert [p.num_frames for p in context.pieces] == [2, 2, 2, 1]
    _end(core, "s", context, frames)
    assert _drain(core)["s"] == expected


def test_a_rebase_takes_effect_once_caught_up_and_answers_as_the_shorter_prompt(model_dir):
    frames = _frames(10, seed=2)
    core = _core(model_dir)
    context = _stream(core, "s", frames)
    used_before = core.block_manager.num_used_blocks
    assert context.trim(6) == 6 and context.num_frames == 4
    ids, items = context.prompt()
    core.rebase_input("s", ids, items)
    assert core.live.shadows and core.live.progress()["s"].num_rebases == 0
    while core.live.shadows:
        core.step()  # the shadow prefills; the live session still holds its blocks meanwhile
    progress = core.live.progress()["s"]
    assert progress.num_rebases == 1 and progress.num_uncomputed == 1  # the held-back last token
    assert core.block_manager.num_used_blocks < used_before
    _end(core, "s", context, frames[6:])
    expected_core = _core(model_dir)
    whole_ids, whole_items = _whole(expected_core, frames[6:])
    expected_core.add_request("w", whole_ids, GREEDY, whole_items)
    assert _drain(core)["s"] == _drain(expected_core)["w"]
    _assert_nothing_held(core)


def test_a_question_before_the_rebase_caught_up_is_answered_by_the_live_context(model_dir):
    frames = _frames(10, seed=4)
    whole = _core(model_dir)
    ids, items = _whole(whole, frames)
    whole.add_request("w", ids, GREEDY, items)
    expected = _drain(whole)["w"]
    core = _core(model_dir)
    context = _stream(core, "s", frames)
    core.rebase_input("s", *_trimmed_prompt(context))
    _end(core, "s", context, frames)  # no step between: the shadow has computed nothing
    assert not core.live.shadows
    assert _drain(core)["s"] == expected
    _assert_nothing_held(core)


def _trimmed_prompt(context: LiveContext):
    copy = LiveContext(context.framing, [s if isinstance(s, list) else type(s)(list(s.pieces), s.closed)
                                         for s in context.segments])
    copy.trim(4)
    return copy.prompt()


def test_abort_with_a_shadow_frees_everything(model_dir):
    core = _core(model_dir, max_num_batched_tokens=16)  # the shadow needs several steps
    context = _stream(core, "s", _frames(8, seed=5))
    core.rebase_input("s", *_trimmed_prompt(context))
    core.step()
    assert core.live.shadows
    core.abort("s")
    core.step()
    _assert_nothing_held(core)


def test_a_session_not_yet_started_is_rebased_in_place(model_dir):
    frames = _frames(6, seed=6)
    core = _core(model_dir)
    ids, _ = _whole(core, frames)
    prefix, _, framing = _split_whole(core, ids)
    context = LiveContext(framing)
    context.add_text(prefix)
    core.open_session("s", GREEDY, prompt_token_ids=prefix, start_after_tokens=None)  # on_end_only
    maker = PieceMaker(core.mm_inputs, fps=2.0)
    for k in range(0, 6, 2):
        core.append_input("s", *context.add_piece(maker.piece(frames[k:k + 2], frames[0].shape[:2])))
    assert core.live.progress()["s"].started is False
    context.trim(2)
    core.rebase_input("s", *context.prompt())
    assert core.live.progress()["s"].num_rebases == 1 and not core.live.shadows
    _end(core, "s", context, frames[2:])
    expected_core = _core(model_dir)
    whole_ids, whole_items = _whole(expected_core, frames[2:])
    expected_core.add_request("w", whole_ids, GREEDY, whole_items)
    assert _drain(core)["s"] == _drain(expected_core)["w"]
