"""MkDocs hook: the benchmark pages show the plots kept in bench-results/ (the repository's results folder,
outside docs/) without copying them: every PNG there joins the site as bench-results/..., so a page links
it as ../bench-results/NAME.png and a missing plot is a broken link that fails `mkdocs build --strict`."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

FOLDER = "bench-results"


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for path in sorted((root / FOLDER).rglob("*.png")):
        rel = path.relative_to(root).as_posix()
        files.append(File(rel, src_dir=str(root), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
