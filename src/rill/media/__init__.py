"""Media in: images (Pillow) and video (PyAV) from uploaded bytes, data: URLs and, where the operator
allows them, remote and local URLs, under the limits of a MediaPolicy.

    from rill.media import MediaPolicy, load_image, load_video
    image = load_image("data:image/png;base64,...", MediaPolicy())          # PIL.Image.Image, mode RGB
    video = load_video(mp4_bytes, MediaPolicy(), fps=2.0, max_frames=32)    # VideoFrames

Every refusal is a MediaError (a ValidationError): the HTTP edge answers it as a 400 with code
invalid_image / invalid_video (the bytes) or invalid_image_url / invalid_video_url (the source).
"""

from rill.media.errors import ImageError, MediaError, MediaSourceError, VideoError
from rill.media.image import decode_image, load_image
from rill.media.policy import MediaPolicy
from rill.media.video import VideoFrames, decode_video, load_video, sample_times

__all__ = [
    "ImageError", "MediaError", "MediaPolicy", "MediaSourceError", "VideoError", "VideoFrames",
    "decode_image", "decode_video", "load_image", "load_video", "sample_times",
]
