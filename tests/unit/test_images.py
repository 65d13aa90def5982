"""Image steps: decoding by either backend, draft mode, keyed augmentation, collation, errors;
identical through worker processes."""

from __future__ import annotations

import base64
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, FormatError
from zephon.ops.image import Flip, RandomResizedCrop, Resize, ToCHW
from zephon.ops.imagedecode import DecodeImage
from zephon.ops.transform import Chain

Image = pytest.importorskip("PIL.Image")


def picture(seed: int, height: int = 120, width: int = 160) -> np.ndarray:
    """Smooth gradients and a block: compresses like a photo, checks orientation."""
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack(
        [(x * 255 // width), (y * 255 // height), np.full_like(x, seed * 37 % 256)], axis=-1
    ).astype(np.uint8)
    img[10:30, 10:50] = (255, 0, 0)
    return img


def encode(img: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


@pytest.mark.parametrize("backend", ["simplejpeg", "pillow"])
def test_jpeg_decodes_by_either_backend_to_the_same_pixels(backend: str) -> None:
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    img = picture(1)
    data = encode(img, "JPEG")
    got = DecodeImage("jpg", backend=backend)({"jpg": data})["jpg"]
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert got.shape == (120, 160, 3) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - reference.astype(int)).mean() < 1.0
    assert np.abs(got.astype(int) - img.astype(int)).mean() < 4.0  # lossy, but the picture
    small = DecodeImage("jpg", backend=backend, max_size=50)({"jpg": data})["jpg"]
    assert small.shape == (60, 80, 3)  # decoded at 1/2 scale: both sides stay >= 50
    # only 1/2, 1/4, 1/8 (libjpeg-turbo's fast scales), never 7/8 or 3/4: full size here
    for size, want in ((100, (120, 160, 3)), (30, (30, 40, 3)), (14, (15, 20, 3))):
        got = DecodeImage("jpg", backend=backend, max_size=size)({"jpg": data})["jpg"]
        assert got.shape == want


def test_png_webp_base64_and_the_hf_layout() -> None:
    img = picture(2)
    for fmt in ("PNG", "WEBP"):
        got = DecodeImage("img", backend="auto")({"img": encode(img, fmt)})["img"]
        if fmt == "PNG":
            assert np.array_equal(got, img)  # lossless
        else:
            assert got.shape == img.shape
    text = base64.b64encode(encode(img, "PNG")).decode()
    assert np.array_equal(DecodeImage("img")({"img": text})["img"], img)
    hf = {"image": {"bytes": encode(img, "PNG"), "path": "a.png"}}
    out = DecodeImage("image", out="pixels")(hf)
    assert np.array_equal(out["pixels"], img) and out["image"] is hf["image"]
    gray = DecodeImage("img", mode="L")({"img": encode(img, "PNG")})["img"]
    assert gray.shape == (120, 160)


def test_a_corrupt_image_is_a_format_error() -> None:
    data = encode(picture(3), "JPEG")
    for broken in (data[: len(data) // 3], b"not an image at all", "%%%"):
        with pytest.raises(FormatError, match="jpg"):
            DecodeImage("jpg")({"jpg": broken})


def test_augmentation_is_keyed_by_the_sample() -> None:
    img = picture(4)
    crop = RandomResizedCrop(64, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
    a = crop({"__key__": "a", "jpg": img})["jpg"]
    assert a.shape == (64, 64, 3)
    assert np.array_equal(a, crop({"__key__": "a", "jpg": img})["jpg"])  # same sample, same crop
    others = [crop({"__key__": k, "jpg": img})["jpg"] for k in "bcdefgh"]
    assert any(not np.array_equal(a, o) for o in others)  # other samples, other crops
    flip = Flip("jpg", 0.5, seed=1)
    flipped = [np.array_equal(flip({"id": i, "jpg": img})["jpg"], img[:, ::-1]) for i in range(64)]
    assert 16 < sum(flipped) < 48  # about half, keyed by id
    always = Flip("jpg", 1.0, seed=1)
    for shape in [(5, 7, 3), (5, 7, 4), (5, 7), (5, 7, 1)]:
        pixels = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
        for image in (pixels, pixels[:, 1:]):  # contiguous or not
            out = always({"id": 0, "jpg": image})["jpg"]
            assert out.flags.c_contiguous and np.array_equal(out, image[:, ::-1])


def _tars(root: Path, n: int = 24) -> None:
    root.mkdir()
    for s in range(2):
        with tarfile.open(root / f"shard-{s}.tar", "w") as tar:
            for i in range(s * n // 2, (s + 1) * n // 2):
                h, w = 90 + 7 * (i % 5), 120 + 11 * (i % 3)  # varied sizes, as real photos
                for ext, data in (
                    ("jpg", encode(picture(i, h, w), "JPEG")),
                    ("cls", str(i % 10).encode()),
                ):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _run(ds: Dataset, processes: int) -> list[np.ndarray]:
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    pipe = (
        Pipeline(ws, rank=0, world_size=1)
        .decode_image("jpg", processes=processes)
        .random_resized_crop(48, processes=processes)
        .flip(seed=3)
        .to_chw()
        .batch(8)
    )
    return [b["jpg"] for b in pipe]


def test_a_webdataset_of_jpegs_to_nchw_batches_identical_in_worker_processes(
    tmp_path: Path,
) -> None:
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")
    here = _run(ds, 0)
    assert [b.shape for b in here] == [(8, 3, 48, 48)] * 3  # one contiguous uint8 array each
    assert all(b.dtype == np.uint8 and b.flags.c_contiguous for b in here)
    pooled = _run(ds, 2)
    assert all(np.array_equal(a, b) for a, b in zip(here, pooled, strict=True))


def test_image_steps_follow_a_pooled_decode_into_one_worker_call(tmp_path: Path) -> None:
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    pipe = (
        Pipeline(ws, rank=0, world_size=1)
        .decode_image("jpg", processes=2)
        .random_resized_crop(48)
        .flip(seed=3)
        .to_chw()
        .batch(8)
    )
    text = pipe.explain()
    assert "map(to_chw(field='jpg'); 2 processes) (in the same worker call)" in text
    assert text.count("(in the same worker call)") == 3
    got = [b["jpg"] for b in pipe]
    assert all(np.array_equal(a, b) for a, b in zip(_run(ds, 0), got, strict=True))
    assert "map#0+1+2+3[0]" in pipe.stats()["stages"]  # one stage: one crossing per block
    alone = Pipeline(ws, rank=0, world_size=1).decode_image("jpg").random_resized_crop(48)
    assert "(in the same worker call)" not in alone.explain()
    assert "(in the same call)" in alone.explain()  # in process: one call on the helper thread
    here = [b["jpg"] for b in alone.flip(seed=3).to_chw().batch(8)]
    # An async filter between them keeps the decode and the crop apart: whole images decoded,
    # then cropped; the fused call, which decodes only the crop, gives the same pixels.
    apart = (
        Pipeline(ws, rank=0, world_size=1)
        .decode_image("jpg")
        .filter(_always)
        .random_resized_crop(48)
        .flip(seed=3)
        .to_chw()
        .batch(8)
    )
    lines = apart.explain().splitlines()
    assert not any("same call" in line for line in lines if "crop" in line or "_always" in line)
    whole = [b["jpg"] for b in apart]
    assert len(here) == len(whole) > 1
    assert all(np.array_equal(a, b) for a, b in zip(whole, here, strict=True))


async def _always(sample: dict[str, Any]) -> bool:
    return True


def _where(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "pid": os.getpid()}


def test_only_image_steps_run_on_this_process_threads_while_the_workers_start(
    tmp_path: Path,
) -> None:
    """A pool's head start (run on threads while its workers start) is for steps that say
    they run without the GIL and keep no state: Zephon's image steps, not a user's map."""
    crop = RandomResizedCrop(48, "jpg", (0.5, 1), (0.75, 1.33), 0)
    image_steps = [
        ("map", DecodeImage("jpg")),
        ("map", crop),
        ("map", Flip("jpg", 0.5, 0)),
        ("map", ToCHW("jpg")),
    ]
    assert Chain(image_steps).releases_gil
    assert not Chain([*image_steps, ("map", _where)]).releases_gil
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    pipe = (
        Pipeline(ws, rank=0, world_size=1).decode_image("jpg", processes=2).map(_where, processes=2)
    )
    pids = {s["pid"] for s in pipe}
    assert pids and os.getpid() not in pids  # the user's map ran in the workers only


def test_corrupt_images_are_skipped_and_counted_when_asked(tmp_path: Path) -> None:
    root = tmp_path / "tars"
    _tars(root)
    with tarfile.open(root / "shard-0.tar", "a") as tar:
        for key, data in (("000100", b"\xff\xd8\xff truncated"), ("000101", b"not an image")):
            info = tarfile.TarInfo(f"{key}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    ds = Dataset.from_path("imgs", str(root), format="webdataset")
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    for processes in (0, 2):  # the message names the dataset, the shard and the sample
        with pytest.raises(FormatError, match="corrupt image in field 'jpg'") as info:
            list(Pipeline(ws, rank=0, world_size=1).decode_image("jpg", processes=processes))
        assert str(root / "shard-0.tar") in str(info.value)
        assert "dataset 'imgs'" in str(info.value) and "sample 12]" in str(info.value)
        assert (info.value.dataset, info.value.sample) == ("imgs", 12)
    with pytest.raises(FormatError, match=r"cannot identify image file\)$"):
        DecodeImage("jpg")({"jpg": b"not an image"})  # not Pillow's name for its BytesIO
    pipe = (
        Pipeline(ws, rank=0, world_size=1, on_error="skip")
        .decode_image("jpg", processes=2)
        .center_crop(32)
    )
    keys = sorted(s["__key__"] for s in pipe)
    assert keys == [f"{i:06d}" for i in range(24)]
    skipped = pipe.stats()["skipped"]
    assert sorted(s["sample"] for s in skipped) == [12, 13]  # after the shard's 12 samples
    assert all(
        s["dataset"] == "imgs"
        and s["shard"].endswith("shard-0.tar")
        and "decode_image" in s["error"]
        for s in skipped
    )


def test_batching_images_of_different_sizes_says_to_resize_first(tmp_path: Path) -> None:
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    with pytest.raises(ConfigError, match=r"field 'jpg' holds images of different sizes.*resize"):
        list(Pipeline(ws, rank=0, world_size=1).decode_image("jpg").batch(8))
    fixed = Pipeline(ws, rank=0, world_size=1).decode_image("jpg").resize((32, 40)).batch(8)
    assert [b["jpg"].shape for b in fixed] == [(8, 32, 40, 3)] * 3


def _raw(img: np.ndarray, mode: str) -> bytes:
    """The raw-pixel layout of MDS's ``pil`` encoding and LitData's ``pil`` serializer."""
    h, w = img.shape[:2]
    return np.array([w, h, len(mode)], np.uint32).tobytes() + mode.encode() + img.tobytes()


def test_raw_pil_pixels_from_mds_and_litdata_decode_without_pillow() -> None:
    from zephon.formats.litdata import _leaf_decoder
    from zephon.formats.mds import _decoder

    img = picture(5)
    for decode in (_decoder("pil", False), _leaf_decoder("pil", False)):
        got = decode(memoryview(_raw(img, "RGB")))
        assert np.array_equal(got, img)
        gray = decode(memoryview(_raw(img[..., 0], "L")))
        assert np.array_equal(gray, img[..., 0])
    with pytest.raises(ValueError, match="PIL mode 'CMYK'"):
        _decoder("pil", False)(memoryview(_raw(img, "CMYK")))
    with pytest.raises(ValueError, match="holds"):
        _decoder("pil", False)(memoryview(_raw(img, "RGB")[:-5]))
    # decode_image takes the pixels as they are, in the mode asked for
    assert np.array_equal(DecodeImage("x")({"x": img})["x"], img)
    rgba = DecodeImage("x", mode="RGBA")({"x": img})["x"]
    assert rgba.shape == (120, 160, 4) and (rgba[..., 3] == 255).all()
    luma = DecodeImage("x", mode="L")({"x": img})["x"]
    reference = np.asarray(Image.fromarray(img).convert("L"))
    assert np.abs(luma.astype(int) - reference.astype(int)).max() <= 1


def test_resize_backends_agree_and_name_themselves() -> None:
    img = picture(5)
    crops = {
        b: RandomResizedCrop(64, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0, backend=b)
        for b in ("auto", "opencv", "pillow")
    }
    out = {b: op({"__key__": "a", "jpg": img})["jpg"] for b, op in crops.items()}
    assert all(o.shape == (64, 64, 3) and o.dtype == np.uint8 for o in out.values())
    assert np.array_equal(out["auto"], out["opencv"])  # OpenCV when installed
    diff = np.abs(out["opencv"].astype(int) - out["pillow"].astype(int))
    assert diff.mean() < 1  # the same crop, resampled a little differently (~0.25)
    assert "backend" not in crops["auto"].__name__  # default names stay as they were
    assert "backend='pillow'" in crops["pillow"].__name__
    small = Resize((20, 30), "jpg", backend="opencv")({"jpg": img})["jpg"]  # shrinking 2x+
    assert small.shape == (20, 30, 3)
    with pytest.raises(ConfigError, match="backend must be one of"):
        Resize(32, "jpg", backend="cv3")


def test_a_crop_of_the_target_size_is_an_array_of_its_own() -> None:
    img = picture(6, height=64, width=64)
    for backend in ("opencv", "pillow"):
        # scale and ratio 1: the whole 64 x 64 image, already the target size
        crop = RandomResizedCrop(64, "jpg", (1.0, 1.0), (1.0, 1.0), seed=0, backend=backend)
        out = crop({"id": 1, "jpg": img[:, :64]})["jpg"]
        assert out.flags.c_contiguous and np.array_equal(out, img)
        wide = np.concatenate([img, img], axis=1)  # 64 x 128: a 64 x 64 crop is a view
        part = RandomResizedCrop(64, "jpg", (0.5, 0.5), (1.0, 1.0), seed=0, backend=backend)
        got = part({"id": 1, "jpg": wide})["jpg"]
        assert got.shape == (64, 64, 3) and got.flags.c_contiguous and got.base is None


def test_to_tensor_lays_out_scales_and_normalises_without_a_python_loop() -> None:
    from zephon.ops.image import ToCHW
    from zephon.ops.tensor import ToTensor

    img = picture(5, 6, 8)
    chw = ToTensor("jpg")({"jpg": img})["jpg"]
    assert chw.dtype == np.uint8 and chw.flags.c_contiguous
    assert np.array_equal(chw, ToCHW("jpg")({"jpg": img})["jpg"])
    assert np.array_equal(chw, img.transpose(2, 0, 1))
    for channels in (1, 2, 4):  # OpenCV's split or numpy's transpose, the same pixels
        pixels = np.arange(6 * 8 * channels, dtype=np.uint8).reshape(6, 8, channels)
        assert np.array_equal(ToCHW("x")({"x": pixels})["x"], pixels.transpose(2, 0, 1))
    assert np.array_equal(ToTensor("jpg", layout="NHWC")({"jpg": img})["jpg"], img)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = ToTensor("jpg", dtype="float32", mean=mean, std=std)({"jpg": img})["jpg"]
    want = ((img / 255.0 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)
    assert got.dtype == np.float32 and got.shape == (3, 6, 8)
    assert np.abs(got - want).max() < 1e-5
    unit = ToTensor("jpg", layout="HWC", dtype="float16")({"jpg": img})["jpg"]
    assert unit.dtype == np.float16 and np.abs(unit - img / 255.0).max() < 1e-3
    gray = ToTensor("g", dtype="float32", mean=0.5, std=0.5)({"g": img[..., 0]})["g"]
    assert gray.shape == (1, 6, 8)
    assert np.abs(gray[0] - (img[..., 0] / 255 - 0.5) / 0.5).max() < 1e-6
    bads = [
        {"layout": "CWH"},
        {"dtype": "int8"},
        {"mean": 0.5},
        {"dtype": "float32", "mean": 0.5, "std": 0},
        {"mean": 0.5, "std": 0.5},
    ]
    for bad in bads:
        with pytest.raises(ConfigError):
            ToTensor("jpg", **bad)  # type: ignore[arg-type]
    for dtype in (np.float32, "float32", np.dtype("float32")):  # torch.float32 too
        same = ToTensor("jpg", layout="nchw", dtype=dtype, mean=mean, std=std)({"jpg": img})
        assert np.array_equal(same["jpg"], got)
    with pytest.raises(ConfigError, match="2 and 2 values for an image of 3 channels"):
        ToTensor("jpg", dtype="float32", mean=(0, 0), std=(1, 1))({"jpg": img})
    with pytest.raises(ConfigError, match="decode_image first"):
        ToTensor("jpg")({"jpg": b"\xff\xd8\xff"})


def test_to_tensor_batches_are_normalised_nchw_identically_in_workers(tmp_path: Path) -> None:
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")

    def run(processes: int) -> list[np.ndarray]:
        ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
        pipe = (
            Pipeline(ws, rank=0, world_size=1)
            .decode_image(processes=processes)
            .center_crop(40)
            .to_tensor(dtype="float32", mean=0.5, std=0.25)
            .batch(8)
        )
        return [b["jpg"] for b in pipe]

    here = run(0)
    assert [b.shape for b in here] == [(8, 3, 40, 40)] * 3 and here[0].dtype == np.float32
    lowest, highest = min(b.min() for b in here), max(b.max() for b in here)
    assert -2.0 <= lowest < highest <= 2.0  # (x / 255 - 0.5) / 0.25
    assert all(np.array_equal(a, b) for a, b in zip(here, run(2), strict=True))


def test_an_image_declaring_too_many_pixels_is_refused_before_it_is_allocated() -> None:
    data = bytearray(encode(picture(6, 16, 16), "JPEG"))
    sof = data.index(b"\xff\xc0")  # baseline frame header: height, width at +5, +7
    data[sof + 5 : sof + 9] = (30000).to_bytes(2, "big") * 2
    for backend in ("simplejpeg", "pillow"):
        with pytest.raises(FormatError, match=r"pixels|exceeds limit") as info:
            DecodeImage("jpg", backend=backend)({"jpg": bytes(data)})
        assert "'jpg'" in str(info.value)
    png = encode(picture(6, 100, 100), "PNG")
    with pytest.raises(FormatError, match="100 x 100 = 10,000 pixels is over max_pixels=5,000"):
        DecodeImage("img", max_pixels=5000)({"img": png})
    assert DecodeImage("img", max_pixels=None)({"img": png})["img"].shape == (100, 100, 3)
    assert "max_pixels" not in DecodeImage("img").__name__  # the default keeps old names


def test_the_binding_is_built_wherever_libjpeg_turbo_headers_are() -> None:
    """setup.py builds zephon._jpeg optionally: a build that failed silently would only show
    as slower epochs, so where the headers are (this project's machines), it must exist."""
    import sysconfig

    from zephon.ops import jpeg

    roots = {"/usr/include", "/usr/local/include", sysconfig.get_paths()["include"]}
    if not any((Path(root) / "jpeglib.h").exists() for root in roots):
        pytest.skip("no libjpeg headers on this machine")
    assert jpeg.available()


def test_random_steps_take_the_work_sources_seed_unless_given_one(tmp_path: Path) -> None:
    """A new seed reorders the data and draws new crops and flips (the steps' seed once
    defaulted to 0, repeating the same crops); a given seed is kept."""
    _tars(tmp_path / "tars")
    ds = Dataset.from_path("imgs", str(tmp_path / "tars"), format="webdataset")

    def crops(source_seed: int, **step_seed: int) -> dict[str, bytes]:
        ws = StaticMixtureWorkSource([ds], seed=source_seed, stop_after_passes=1)
        pipe = (
            Pipeline(ws, rank=0, world_size=1)
            .decode_image("jpg")
            .random_resized_crop(32, **step_seed)
            .flip(**step_seed)
        )
        return {s["__key__"]: s["jpg"].tobytes() for s in pipe}

    one, two = crops(1), crops(2)
    assert one.keys() == two.keys()
    assert sum(one[k] != two[k] for k in one) > len(one) // 2
    assert crops(1, seed=7) == crops(2, seed=7)  # the step's own seed, whatever the source's
    assert crops(5) == crops(5)
