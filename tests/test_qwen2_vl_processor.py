"""The Qwen2-VL processor's pixel values and grids against transformers' (the oracle).

Images: transformers' Pillow image processor (the one it uses without torchvision), value for value.
Videos: transformers' video processor needs torchvision; where it imports, values are compared with
it; everywhere, a clip's layout is checked against the image path (a still clip of two equal frames
is one image) and frames that do not divide by the temporal patch repeat the last one.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from helpers_vision import noise_clip, noise_image
from rill.errors import ValidationError
from rill.multimodal.qwen2_vl_processor import PixelConfig, process_image, process_video, smart_resize

SIZES = [(64, 48), (300, 97), (30, 30), (1000, 700), (56, 112), (28, 28), (17, 301)]
LIMITS = [{}, {"max_pixels": 200 * 200}, {"min_pixels": 100 * 100}, {"min_pixels": 28 * 28, "max_pixels": 56 * 56}]


@pytest.mark.parametrize("limits", LIMITS, ids=str)
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_image_pixels_equal_transformers(size, limits):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = noise_image(*size, seed=sum(size))
    hf = Qwen2VLImageProcessorPil(**limits)
    theirs = hf(images=[image], return_tensors="pt")
    ours = process_image(image, PixelConfig(**limits))
    assert list(ours.grid_thw) == theirs["image_grid_thw"][0].tolist()
    assert torch.equal(ours.values, theirs["pixel_values"])
    assert ours.num_tokens * 4 == hf.get_number_of_image_patches(size[1], size[0], dict(limits))


@pytest.mark.parametrize("mode", ["L", "RGBA", "P"])
def test_image_modes_equal_transformers(mode):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image = noise_image(70, 50, seed=7).convert(mode)
    if mode == "RGBA":
        image.putalpha(128)
    theirs = Qwen2VLImageProcessorPil()(images=[image], return_tensors="pt")["pixel_values"]
    # rill.media hands RGB images (transparency composited onto white, as transformers' convert_to_rgb)
    from rill.media.image import to_rgb

    assert torch.equal(process_image(to_rgb(image), PixelConfig()).values, theirs)


def test_preprocessor_config_fields_are_read(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(
        '{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,'
        ' "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.25, 0.25]}')
    cfg = PixelConfig.from_dir(tmp_path)
    assert (cfg.min_pixels, cfg.max_pixels, cfg.image_mean) == (3136, 12845056, (0.5, 0.5, 0.5))
    assert PixelConfig.from_dict({"size": {"shortest_edge": 10, "longest_edge": 20}}).max_pixels == 20


def test_smart_resize_refuses_extreme_aspect_ratio():
    assert smart_resize(28, 28 * 200, PixelConfig())
    with pytest.raises(ValidationError, match="aspect ratio"):
        smart_resize(10, 2010, PixelConfig())


def test_still_clip_is_the_image():
    image = noise_image(84, 56, seed=3)
    still = process_video([image, image], PixelConfig())
    assert still.grid_thw == process_image(image, PixelConfig()).grid_thw
    # the video path folds the rescale into mean and std: equal up to float32 rounding
    assert torch.allclose(still.values, process_image(image, PixelConfig()).values, atol=1e-5)


@pytest.mark.parametrize("num_frames", [1, 2, 3, 5, 8])
def test_clip_grid_and_last_frame_repeat(num_frames):
    frames = noise_clip(num_frames)
    out = process_video(frames, PixelConfig())
    t, h, w = out.grid_thw
    assert t == (num_frames + 1) // 2 and (h, w) == (4, 6)
    assert out.values.shape == (t * h * w, 3 * 2 * 14 * 14)
    if num_frames % 2:  # the last temporal patch holds the last frame twice
        last = out.values[-h * w:].view(h * w, 3, 2, 14 * 14)
        assert torch.equal(last[:, :, 0], last[:, :, 1])


def test_clip_frames_must_agree_and_exist():
    with pytest.raises(ValidationError, match="no frames"):
        process_video([], PixelConfig())
    with pytest.raises(ValidationError, match="differ in size"):
        process_video([noise_image(56, 56), noise_image(84, 56)], PixelConfig())


def test_video_pixels_equal_transformers_video_processor():
    try:
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    except (ImportError, RuntimeError) as exc:  # it needs torchvision; PyPI's is built for CUDA's torch
        pytest.skip(f"transformers' video processor needs torchvision: {exc}")
    frames = noise_clip(5, 100, 70)
    video = torch.stack([torch.from_numpy(__import__("numpy").asarray(f)).permute(2, 0, 1) for f in frames])
    theirs = Qwen2VLVideoProcessor()(videos=[video], return_tensors="pt", cap_pixels_per_frame=False)
    ours = process_video(frames, PixelConfig())
    assert list(ours.grid_thw) == theirs["video_grid_thw"][0].tolist()
    assert torch.equal(ours.values, theirs["pixel_values_videos"])


def test_resized_image_is_resized_by_pillow_bicubic():
    image = Image.new("RGB", (300, 97), "white")
    assert process_image(image, PixelConfig()).grid_thw == (1, 6, 22)
