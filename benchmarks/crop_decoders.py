"""The decoders benchmarks/crop_decode.py compares: for each library, a whole decode, a decode at 1/2 DCT scale where
it offers one, and a crop box's decode (a region decode where it has one, else the whole image sliced); DALI's
through a one-thread CPU pipeline, in batches. Each maker raises ImportError where its library is missing."""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import numpy as np
import torch

Box = tuple[int, int, int, int]  # top, left, height, width


def sliced(whole: Callable[[bytes], np.ndarray]) -> Callable[[bytes, Box], np.ndarray]:
    def region(jpeg: bytes, box: Box) -> np.ndarray:
        top, left, height, width = box
        return whole(jpeg)[top : top + height, left : left + width]

    region.whole_and_slice = True
    return region


def pillow() -> dict:
    from PIL import Image

    def whole(jpeg: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))

    def scaled(jpeg: bytes) -> np.ndarray:
        image = Image.open(io.BytesIO(jpeg))
        image.draft("RGB", (image.width // 2, image.height // 2))
        return np.asarray(image.convert("RGB"))

    return {"whole": whole, "scaled": scaled, "region": sliced(whole)}


def simplejpeg_() -> dict:
    import simplejpeg

    def whole(jpeg: bytes) -> np.ndarray:
        return simplejpeg.decode_jpeg(jpeg, "RGB")

    def scaled(jpeg: bytes) -> np.ndarray:
        height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
        return simplejpeg.decode_jpeg(jpeg, "RGB", min_height=-(-height // 2), min_width=-(-width // 2))

    return {"whole": whole, "scaled": scaled, "region": sliced(whole)}


def opencv() -> dict:
    import cv2

    cv2.setNumThreads(1)

    def whole(jpeg: bytes) -> np.ndarray:
        return cv2.cvtColor(cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

    def scaled(jpeg: bytes) -> np.ndarray:
        bgr = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_REDUCED_COLOR_2)
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

    return {"whole": whole, "scaled": scaled, "region": sliced(whole)}


def torchvision_() -> dict:
    from torchvision.io import decode_jpeg

    def whole(jpeg: bytes) -> np.ndarray:
        return decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)).permute(1, 2, 0).numpy()

    return {"whole": whole, "region": sliced(whole)}


def imagecodecs_() -> dict:
    import imagecodecs

    def whole(jpeg: bytes) -> np.ndarray:
        return imagecodecs.jpeg8_decode(jpeg)

    return {"whole": whole, "region": sliced(whole)}


def pyvips_() -> dict:
    os.environ.setdefault("VIPS_CONCURRENCY", "1")
    import pyvips

    pyvips.cache_set_max(0)

    def whole(jpeg: bytes) -> np.ndarray:
        return pyvips.Image.new_from_buffer(jpeg, "", access="sequential").numpy()

    def scaled(jpeg: bytes) -> np.ndarray:
        return pyvips.Image.new_from_buffer(jpeg, "", shrink=2, access="sequential").numpy()

    def region(jpeg: bytes, box: Box) -> np.ndarray:
        top, left, height, width = box
        image = pyvips.Image.new_from_buffer(jpeg, "", access="sequential")
        return image.crop(left, top, width, height).numpy()

    return {"whole": whole, "scaled": scaled, "region": region}


def nvimgcodec_() -> dict:
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
    from nvidia import nvimgcodec

    backends = [nvimgcodec.Backend(nvimgcodec.CPU_ONLY)]
    device = nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY
    decoder = nvimgcodec.Decoder(device_id=device, max_num_cpu_threads=1, backends=backends)
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.SRGB, apply_exif_orientation=False)

    def whole(jpeg: bytes) -> np.ndarray:
        return np.asarray(decoder.decode(nvimgcodec.CodeStream(jpeg), params=params).cpu())

    def region(jpeg: bytes, box: Box) -> np.ndarray:
        top, left, height, width = box
        area = nvimgcodec.Region(start=(top, left), end=(top + height, left + width))
        stream = nvimgcodec.CodeStream(jpeg).get_sub_code_stream(region=area)
        return np.asarray(decoder.decode(stream, params=params).cpu())

    return {"whole": whole, "region": region}


def dali() -> dict:
    from nvidia.dali import fn, pipeline_def, types

    batch = 32

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=1, exec_pipelined=False)
    def pipeline(region: bool):  # DALI's graph of operators
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
        if not region:
            return fn.decoders.image(jpegs, output_type=types.RGB)
        anchor, shape = fn.external_source(name="anchor"), fn.external_source(name="shape")
        return fn.decoders.image_slice(
            jpegs,
            anchor,
            shape,
            normalized_anchor=False,
            normalized_shape=False,
            axis_names="WH",
            output_type=types.RGB,
        )

    pipes = {kind: pipeline(region=kind) for kind in (False, True)}
    for pipe in pipes.values():
        pipe.build()

    def run(jpegs: list[bytes], chosen: list[Box] | None) -> list[np.ndarray]:
        out = []
        for start in range(0, len(jpegs), batch):
            part = [np.frombuffer(jpeg, np.uint8) for jpeg in jpegs[start : start + batch]]
            pipe = pipes[chosen is not None]
            pipe.feed_input("jpegs", part)  # a last batch may be smaller
            if chosen is not None:
                own = chosen[start : start + batch]
                pipe.feed_input("anchor", [np.array([left, top], np.float32) for top, left, _, _ in own])
                pipe.feed_input("shape", [np.array([w, h], np.float32) for _, _, h, w in own])
            (images,) = pipe.run()
            out += [np.array(images[row]) for row in range(len(part))]  # a copy: DALI reuses its buffers
        return out

    return {"batched": run}


CANDIDATES = {
    "Pillow (draft)": pillow,
    "simplejpeg": simplejpeg_,
    "OpenCV": opencv,
    "torchvision decode_jpeg": torchvision_,
    "imagecodecs": imagecodecs_,
    "pyvips + pyvips-binary": pyvips_,
    "nvImageCodec CPU": nvimgcodec_,
    "DALI CPU (image_slice)": dali,
}
