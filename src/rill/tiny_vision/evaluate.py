"""Held-out evaluation of rill-tiny-vision: exact answers per task family.

    rill eval-tiny-vision [--model DIR] [--per-family N] [--backend transformers|rill] [--json FILE]

Pictures and clips come from the held-out split (combination keys never trained on: a circle's
colour in a quadrant, numbers, digit sequences, ...), drawn from the evaluation seed with the
recipe's variety. An answer counts when it equals the expected one exactly (surrounding spaces
aside). The bar is 95% per family.

Backends: `transformers` runs Qwen2VLForConditionalGeneration's greedy `generate` on inputs built
the way Qwen2VLProcessor builds them (the tokenizer's chat template, the image processor's pixel
values, placeholders expanded to the grid; clips through the video processor's patching, which
transformers runs only with torchvision installed). `rill` runs the same turns through rill's offline
LLM.generate (the rendered prompt with vLLM's multi_modal_data).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rill.tiny_vision import dataset, tasks

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "rill-tiny-vision"
BAR = 0.95


class TransformersBackend:
    """Greedy `generate` of transformers' Qwen2VLForConditionalGeneration, batched with left padding."""

    def __init__(self, model_dir: Path, device: str = "cpu", batch_size: int = 25) -> None:
        import torch
        from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.image_processor = AutoImageProcessor.from_pretrained(model_dir)
        self.model = Qwen2VLForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        self.merge = self.model.config.vision_config.spatial_merge_size
        self.device, self.batch_size = device, batch_size

    def answer(self, examples: list[tasks.Example]) -> list[str]:
        out = []
        for start in range(0, len(examples), self.batch_size):
            out += self._batch(examples[start : start + self.batch_size])
        return out

    def inputs(self, example: tasks.Example) -> tuple[list[int], dict]:
        """One example's ids (placeholders expanded) and its pixel tensors, as Qwen2VLProcessor makes them."""
        text = self.tokenizer.apply_chat_template(dataset.messages(example), add_generation_prompt=True, tokenize=False)
        if example.frames is not None:
            pixels, grid = dataset.pixels_of(example, _shape_of(self.model.config))
            token, extra = "<|video_pad|>", {"pixel_values_videos": pixels, "video_grid_thw": self.torch.tensor([grid])}
        else:
            processed = self.image_processor(images=[example.image], return_tensors="pt")
            grid = processed["image_grid_thw"][0].tolist()
            token, extra = "<|image_pad|>", {"pixel_values": processed["pixel_values"],
                                             "image_grid_thw": processed["image_grid_thw"]}
        count = grid[0] * grid[1] * grid[2] // self.merge**2
        text = text.replace(token, token * count, 1)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"], extra

    def _batch(self, examples: list[tasks.Example]) -> list[str]:
        torch = self.torch
        built = [self.inputs(e) for e in examples]
        width = max(len(ids) for ids, _ in built)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(built), width), pad, dtype=torch.long)
        mask = torch.zeros((len(built), width), dtype=torch.long)
        for row, (row_ids, _) in enumerate(built):
            ids[row, width - len(row_ids):] = torch.tensor(row_ids)
            mask[row, width - len(row_ids):] = 1
        config = self.model.config
        types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
        parts: dict[str, list] = {}
        for _, tensors in built:  # pictures and clips may share a batch
            for key, value in tensors.items():
                parts.setdefault(key, []).append(value)
        extra = {key: torch.cat(values) for key, values in parts.items()}
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      mm_token_type_ids=types.to(self.device),
                                      **{k: v.to(self.device) for k, v in extra.items()},
                                      max_new_tokens=8, do_sample=False)
        return [self.tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]


def _shape_of(config):
    from rill.tiny_vision.model import Shape

    vision = config.vision_config
    return Shape(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                 temporal_patch_size=vision.temporal_patch_size)


class RillBackend:
    """rill's offline LLM: the template-rendered turn with the picture or clip as vLLM's multi_modal_data."""

    def __init__(self, model_dir: Path) -> None:
        from rill.offline import LLM
        from rill.sampling_params import SamplingParams

        self.llm = LLM(model=str(model_dir))
        self.params = SamplingParams(temperature=0.0, max_tokens=8)

    def answer(self, examples: list[tasks.Example]) -> list[str]:
        prompts = [{"prompt": dataset.prompt_text(e), "multi_modal_data": _media(e)} for e in examples]
        return [o.outputs[0].text.strip() for o in self.llm.generate(prompts, self.params)]


def _media(example: tasks.Example) -> dict:
    return {"video": example.frames} if example.frames is not None else {"image": example.image}


def evaluate(backend, seed: int, per_family: int, families=tasks.FAMILIES) -> dict:
    """{family: {"correct", "total", "accuracy", "wrong": [(expected, got), ...] (first 5)}}."""
    table = {}
    for family in families:
        examples = tasks.eval_examples(seed, family, per_family)
        answers = backend.answer(examples)
        wrong = [(e.answer, a) for e, a in zip(examples, answers) if a != e.answer]
        correct = len(examples) - len(wrong)
        table[family] = {"correct": correct, "total": len(examples), "accuracy": correct / len(examples),
                         "wrong": wrong[:5]}
    return table


def format_table(table: dict, title: str) -> str:
    lines = [title, "", "| family | question | correct | accuracy |", "|---|---|---|---|"]
    for family, row in table.items():
        lines.append(f"| {family} | {tasks.QUESTIONS[family][0]} | {row['correct']}/{row['total']} | "
                     f"{100 * row['accuracy']:.1f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rill eval-tiny-vision", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL_DIR)
    p.add_argument("--seed", type=int, default=0, help="the evaluation draw (held-out keys are fixed)")
    p.add_argument("--per-family", type=int, default=200)
    p.add_argument("--backend", choices=("transformers", "rill"), default="transformers")
    p.add_argument("--families", nargs="+", default=list(tasks.FAMILIES), choices=tasks.FAMILIES)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    backend = TransformersBackend(args.model) if args.backend == "transformers" else RillBackend(args.model)
    table = evaluate(backend, args.seed, args.per_family, args.families)
    elapsed = time.perf_counter() - started
    print(format_table(table, f"rill-tiny-vision held-out ({args.backend}, {args.model}, seed {args.seed}, "
                              f"{elapsed:.0f} s)"))
    for family, row in table.items():
        if row["wrong"]:
            print(f"{family}: first wrong (expected, got): {row['wrong']}")
    if args.json:
        args.json.write_text(json.dumps({"backend": args.backend, "model": str(args.model), "seed": args.seed,
                                         "seconds": round(elapsed, 1), "table": table}, indent=2) + "\n")
    passed = all(row["accuracy"] >= BAR for row in table.values())
    print(f"bar {BAR:.0%} per family: {'met' if passed else 'NOT met'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
