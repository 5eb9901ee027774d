"""MediaPolicy: where media may come from and how large it may be, set by the operator.

By default only `data:` URLs and uploaded bytes are read. Remote http(s) URLs are read only from the
hosts in `allowed_media_domains` and local files only under `allowed_local_media_path` (vLLM's
`--allowed-media-domains` and `--allowed-local-media-path`). Every limit is inclusive: a value equal
to it is accepted, one past it is refused.

`rill serve` fills the policy from flags and RILL_* variables (`add_arguments` / `from_args`); the
server keeps it as `ServerConfig.media`.
"""

from __future__ import annotations

import os

import msgspec

DEFAULT_FETCH_TIMEOUT_S = 10.0
DEFAULT_MAX_MEDIA_BYTES = 32 << 20  # encoded bytes of one image or video, whatever its source
DEFAULT_MAX_REDIRECTS = 5
# An 8K UHD frame (7680 x 4320 = 33.2 M) fits; Pillow's own warning limit is 89.5 M. Decoded as RGB,
# the largest accepted image holds 120 MB.
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_MAX_VIDEO_FRAME_PIXELS = 3840 * 2160  # 4K UHD
DEFAULT_MAX_VIDEO_SECONDS = 600.0
DEFAULT_MAX_VIDEO_DECODED_FRAMES = 18_000  # 10 minutes at 30 fps: bounds the decoder's work
# Pixels of every frame the decoder must produce (frames x width x height), known after the demux pass and
# before any decoding: 1,200 black 4K frames fit in 63 KB of H.264 and took 17 s of a core to decode. 4 G
# is about a minute of 1080p at 30 fps, or 7 s of decoding on one core.
DEFAULT_MAX_VIDEO_DECODED_PIXELS = 4_000_000_000
DEFAULT_MAX_VIDEO_FRAMES = 768  # sampled frames returned (Qwen2-VL's own FPS_MAX_FRAMES)
DEFAULT_MAX_VIDEO_SAMPLED_PIXELS = 256_000_000  # the sampled frames' pixels in all: 768 MB as RGB


class MediaPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Sources and limits for `load_image` / `load_video` (immutable: share one across threads)."""

    allowed_media_domains: tuple[str, ...] = ()  # exact host names (case-insensitive); () = no remote media
    allowed_local_media_path: str | None = None  # a directory; None = no local files
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S  # a whole remote fetch, redirects included
    max_media_bytes: int = DEFAULT_MAX_MEDIA_BYTES
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_video_frame_pixels: int = DEFAULT_MAX_VIDEO_FRAME_PIXELS
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS
    max_video_decoded_frames: int = DEFAULT_MAX_VIDEO_DECODED_FRAMES
    max_video_decoded_pixels: int = DEFAULT_MAX_VIDEO_DECODED_PIXELS
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES
    max_video_sampled_pixels: int = DEFAULT_MAX_VIDEO_SAMPLED_PIXELS

    def __post_init__(self):
        for name in ("max_media_bytes", "max_image_pixels", "max_video_frame_pixels", "max_video_decoded_frames",
                     "max_video_decoded_pixels", "max_video_frames", "max_video_sampled_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_redirects < 0:
            raise ValueError(f"max_redirects must be >= 0, got {self.max_redirects}")
        for name in ("fetch_timeout_s", "max_video_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def allows_remote(self) -> bool:
        return bool(self.allowed_media_domains)

    def allows_host(self, host: str | None) -> bool:
        return bool(host) and host.lower().rstrip(".") in {d.lower().rstrip(".") for d in self.allowed_media_domains}

    @classmethod
    def from_env(cls) -> MediaPolicy:
        env = os.environ.get
        domains = env("RILL_ALLOWED_MEDIA_DOMAINS", "")
        return cls(
            allowed_media_domains=tuple(d.strip() for d in domains.split(",") if d.strip()),
            allowed_local_media_path=env("RILL_ALLOWED_LOCAL_MEDIA_PATH") or None,
            fetch_timeout_s=float(env("RILL_MEDIA_FETCH_TIMEOUT_S", DEFAULT_FETCH_TIMEOUT_S)),
            max_media_bytes=int(env("RILL_MAX_MEDIA_BYTES", DEFAULT_MAX_MEDIA_BYTES)),
        )


# -- `rill serve` flags (their defaults come from the RILL_* variables above) -----------------------------


def add_arguments(parser) -> None:
    env = MediaPolicy.from_env()
    g = parser.add_argument_group("media input (image_url and video_url content parts)")
    g.add_argument("--allowed-media-domains", nargs="+", default=list(env.allowed_media_domains), metavar="HOST",
                   help="hosts whose http(s) media URLs may be fetched (default: none, remote media off) "
                        "[RILL_ALLOWED_MEDIA_DOMAINS, comma-separated]")
    g.add_argument("--allowed-local-media-path", default=env.allowed_local_media_path, metavar="DIR",
                   help="a directory whose files file:// media URLs may read (default: none) "
                        "[RILL_ALLOWED_LOCAL_MEDIA_PATH]")
    g.add_argument("--media-fetch-timeout-s", type=float, default=env.fetch_timeout_s,
                   help="seconds one remote media fetch may take, redirects included (default %(default)s)")
    g.add_argument("--max-media-bytes", type=int, default=env.max_media_bytes,
                   help="encoded bytes of one image or video from any source (default %(default)s)")


def from_args(args) -> MediaPolicy:
    return MediaPolicy(
        allowed_media_domains=tuple(args.allowed_media_domains or ()),
        allowed_local_media_path=args.allowed_local_media_path or None,
        fetch_timeout_s=args.media_fetch_timeout_s, max_media_bytes=args.max_media_bytes,
    )
