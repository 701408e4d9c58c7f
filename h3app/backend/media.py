"""Decoded frames + stereo audio → a browser-playable mp4 (h264 yuv420p + AAC), with the settings inside; and back,
for the UI: an mp4's soundtrack as a WAV (the A/B audio players) and its frames (comparing two history entries),
decoded from the lossy mp4 and labelled as such.

Hashes are computed on the decoded arrays (docs/architecture.md, decision 10), never on mp4 bytes: encoders are not bitwise
stable across machines, the pipeline's output is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import wave
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..rules.frames import FPS

SETTINGS_TAG = "comment"  # an mp4 metadata key that ffmpeg writes and reads back as a plain string
AUDIO_BIT_RATE = 128_000


def content_hash(video: np.ndarray, audio: np.ndarray) -> str:
    """sha256 over the raw float32 bytes of ``video`` (``[F, H, W, 3]`` in [0, 1]) then ``audio`` (``[2, S]``)."""
    digest = hashlib.sha256()
    for array in (video, audio):
        digest.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return "sha256:" + digest.hexdigest()


def to_uint8(video: np.ndarray) -> np.ndarray:
    """``[F, H, W, 3]`` float in [0, 1] → uint8, rounded."""
    return np.clip(np.rint(np.asarray(video, dtype=np.float32) * 255.0), 0, 255).astype(np.uint8)


@contextmanager
def _partial(path: Path) -> Iterator[Path]:
    """A ``<name>.partial`` file to write ``path`` through: renamed to ``path`` when the block (and the container it
    opened, closed first) ends cleanly, deleted when it fails — a failed encode leaves no file behind."""
    tmp = path.with_name(path.name + ".partial")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def write_mp4(path: str | Path, video: np.ndarray, audio: np.ndarray, sample_rate: int, *, fps: int = FPS,
              settings: Mapping[str, Any] | None = None, audio_thread: bool = True) -> Path:
    """Write ``video`` (``[F, H, W, 3]`` float in [0, 1], H and W even) and ``audio`` (``[channels, samples]`` float
    in [-1, 1], stereo) to an mp4; ``settings`` go into the container metadata as JSON. ``audio_thread``: encode
    the soundtrack in a second thread beside the video (False when the caller already encodes beside other work)."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = to_uint8(video)
    audio = np.ascontiguousarray(np.clip(audio, -1.0, 1.0), dtype=np.float32)
    if audio.ndim != 2:
        raise ValueError(f"audio must be [channels, samples], got shape {audio.shape}")
    with _partial(path) as tmp, av.open(str(tmp), mode="w", format="mp4") as container:
        if settings is not None:
            container.metadata[SETTINGS_TAG] = json.dumps(settings, sort_keys=True, default=str)
        vstream = container.add_stream("libx264", rate=fps)
        vstream.width, vstream.height = int(frames.shape[2]), int(frames.shape[1])
        vstream.pix_fmt = "yuv420p"
        vstream.options = {"crf": "18", "preset": "veryfast"}
        astream = container.add_stream("aac", rate=sample_rate)
        astream.layout = "stereo" if audio.shape[0] == 2 else "mono"
        astream.bit_rate = AUDIO_BIT_RATE
        # The two encoders can run at once (PyAV releases the GIL inside them; AAC alone is ~0.2 s for 5 s of
        # stereo); the packets are muxed afterwards: the mp4 muxer interleaves them by timestamp.
        audio_packets: list[Any] = []
        audio_errors: list[BaseException] = []
        encode_audio = functools.partial(_encode_audio, astream, audio, sample_rate, audio_packets, audio_errors)
        beside = threading.Thread(target=encode_audio, name="h3app-aac") if audio_thread else None
        if beside is not None:
            beside.start()
        try:
            video_packets = [packet for frame in frames
                             for packet in vstream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24"))]
            video_packets.extend(vstream.encode())
        finally:
            if beside is not None:
                beside.join()
        if beside is None:
            encode_audio()
        if audio_errors:
            raise audio_errors[0]
        for packet in video_packets + audio_packets:
            container.mux(packet)
    return path


def _encode_audio(astream: Any, audio: np.ndarray, sample_rate: int, packets: list[Any],
                  errors: list[BaseException]) -> None:
    """Encode ``audio`` (``[channels, samples]`` float32) in 1024-sample frames into ``packets`` (run in a thread:
    an error is handed back in ``errors``)."""
    import av

    try:
        chunk = 1024
        for start in range(0, audio.shape[1], chunk):
            piece = np.ascontiguousarray(audio[:, start:start + chunk])
            aframe = av.AudioFrame.from_ndarray(piece, format="fltp", layout=astream.layout.name)
            aframe.sample_rate = sample_rate
            aframe.pts = start
            aframe.time_base = Fraction(1, sample_rate)
            packets.extend(astream.encode(aframe))
        packets.extend(astream.encode())
    except BaseException as error:  # noqa: BLE001 - re-raised by write_mp4 in the caller's thread
        errors.append(error)


def remux_with_settings(source: str | Path, target: str | Path, settings: Mapping[str, Any]) -> Path:
    """Copy ``source``'s encoded streams into ``target`` (no re-encode) with ``settings`` as its metadata: the mp4 of
    a result bit-identical to one already written."""
    import av

    target = Path(target)
    with _partial(target) as tmp, av.open(str(source)) as src, av.open(str(tmp), mode="w", format="mp4") as dst:
        dst.metadata[SETTINGS_TAG] = json.dumps(settings, sort_keys=True, default=str)
        streams = {stream.index: dst.add_stream_from_template(stream) for stream in src.streams
                   if stream.type in ("video", "audio")}
        for packet in src.demux(*[src.streams[i] for i in streams]):
            if packet.dts is None:  # the demuxer's end-of-stream marker
                continue
            packet.stream = streams[packet.stream.index]
            dst.mux(packet)
    return target


@dataclass(frozen=True)
class MediaInfo:
    """What an mp4 holds, as read back with PyAV."""

    video_codec: str | None
    width: int
    height: int
    frames: int
    fps: float
    pix_fmt: str | None
    audio_codec: str | None
    audio_channels: int
    sample_rate: int
    duration_s: float
    settings: dict[str, Any] | None


def probe_mp4(path: str | Path) -> MediaInfo:
    """Streams, counts and the embedded settings of an mp4 (decodes the video to count frames)."""
    import av

    with av.open(str(path)) as container:
        settings_text = container.metadata.get(SETTINGS_TAG)
        video = container.streams.video[0] if container.streams.video else None
        audio = container.streams.audio[0] if container.streams.audio else None
        frames = sum(1 for _ in container.decode(video=0)) if video is not None else 0
        duration = float(container.duration / 1_000_000) if container.duration else 0.0
        return MediaInfo(
            video_codec=video.codec_context.name if video else None,
            width=video.codec_context.width if video else 0,
            height=video.codec_context.height if video else 0,
            frames=frames,
            fps=float(video.average_rate) if video and video.average_rate else 0.0,
            pix_fmt=video.codec_context.pix_fmt if video else None,
            audio_codec=audio.codec_context.name if audio else None,
            audio_channels=audio.codec_context.channels if audio else 0,
            sample_rate=audio.codec_context.sample_rate if audio else 0,
            duration_s=duration,
            settings=json.loads(settings_text) if settings_text else None,
        )


def read_settings(path: str | Path) -> dict[str, Any] | None:
    """The settings JSON stored in an mp4 written by :func:`write_mp4` (None when absent)."""
    import av

    with av.open(str(path)) as container:
        text = container.metadata.get(SETTINGS_TAG)
    return json.loads(text) if text else None


def resample_audio(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``[channels, samples]`` float32 at ``from_rate`` → the same at ``to_rate`` (PyAV's libswresample)."""
    import av

    audio = np.ascontiguousarray(audio, dtype=np.float32)
    if from_rate == to_rate:
        return audio
    layout = {1: "mono", 2: "stereo"}.get(audio.shape[0])
    if layout is None:
        raise ValueError(f"only mono or stereo audio can be resampled, got {audio.shape[0]} channels")
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=to_rate)
    frame = av.AudioFrame.from_ndarray(audio, format="fltp", layout=layout)
    frame.sample_rate = from_rate
    pieces = [out.to_ndarray() for out in resampler.resample(frame)]
    pieces += [out.to_ndarray() for out in resampler.resample(None)]
    return np.concatenate(pieces, axis=1).astype(np.float32) if pieces else np.zeros((audio.shape[0], 0), np.float32)


def write_thumbnail(path: str | Path, video: np.ndarray, max_side: int = 256) -> Path:
    """The middle frame as a PNG, at most ``max_side`` pixels on its long side."""
    from PIL import Image

    image = Image.fromarray(to_uint8(video[len(video) // 2]))  # one frame converted, not the whole video
    image.thumbnail((max_side, max_side))
    path = Path(path)
    image.save(path)
    return path


def extract_audio(mp4: str | Path, wav: str | Path) -> Path:
    """Decode the audio track of ``mp4`` to a 16-bit PCM WAV (channels kept) at ``wav``."""
    import av

    chunks: list[np.ndarray] = []
    rate, channels = 0, 0
    with av.open(str(mp4)) as container:
        stream = next(iter(container.streams.audio))  # the first audio stream
        rate = stream.codec_context.sample_rate
        for frame in container.decode(stream):
            samples = frame.to_ndarray()  # planar float: [channels, n]; packed: [1, n * channels]
            if frame.format.is_planar:
                chunks.append(samples.astype(np.float32))
            else:
                chunks.append(samples.reshape(-1, len(frame.layout.channels)).T.astype(np.float32))
    audio = np.concatenate(chunks, axis=1) if chunks else np.zeros((2, 0), np.float32)
    channels = audio.shape[0]
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").T.reshape(-1)
    wav = Path(wav)
    with wave.open(str(wav), "wb") as handle:
        handle.setnchannels(channels)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(pcm.tobytes())
    return wav


def decode_video(mp4: str | Path) -> np.ndarray:
    """``[F, H, W, 3]`` float32 in [0, 1] from an mp4 (lossy: h264)."""
    import av

    with av.open(str(mp4)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames).astype(np.float32) / 255.0 if frames else np.zeros((0, 0, 0, 3), np.float32)
