"""The image steps of :class:`~zephon.pipeline.builder.Pipeline` (a mixin): decode_image,
resize, center_crop, random_resized_crop, flip, to_chw and to_tensor, each a ``map`` of a
picklable step from :mod:`zephon.ops.image` (:mod:`zephon.ops.tensor`), so ``processes=``
and ``executor=`` apply as to any map.

An image step given no placement runs where the image step before it runs, and adjacent
steps on the same workers run as one call per block (:mod:`zephon.pipeline.steps`): so
``decode_image(processes=2).random_resized_crop(224).flip().to_chw()`` sends encoded bytes
to a worker and gets the final uint8 arrays back, never a full-size decoded image."""

from __future__ import annotations

from typing import Any, Self

from zephon.choices import ImageBackend, ImageMode, ResizeBackend, TensorDtype, TensorLayout
from zephon.ops import image, imagedecode, tensor
from zephon.ops.imagelimits import MAX_PIXELS
from zephon.ops.itemops import Map
from zephon.ops.objects import FetchField
from zephon.ops.operator import Operator
from zephon.pipeline.placement import placement
from zephon.pipeline.spec import PipelineSpec

__all__ = ["ImageSteps"]

_IMAGE_MODULES = (
    image.__name__,
    imagedecode.__name__,
    tensor.__name__,
)  # whose steps follow an image step's placement


class ImageSteps:
    """Steps from encoded images to fixed-size uint8 arrays; each returns a new pipeline."""

    def _with(self, op: Operator | None = None, **changes: Any) -> Self:
        raise NotImplementedError

    def _check_before_batch(self, what: str) -> None:
        raise NotImplementedError

    spec: PipelineSpec

    def _image_step(self, op: Any, processes: int | None, executor: Any) -> Self:
        self._check_before_batch(op.__name__.split("(")[0])
        if processes is None:
            steps = self.spec.steps
            before = steps[-1] if steps and executor is None else None
            if isinstance(before, Map) and type(before.fn).__module__ in _IMAGE_MODULES:
                return self._with(Map(op, before.processes, before.executor))
            processes = 0
        inflight, remote = placement(processes, executor, op, "image step")
        return self._with(Map(op, inflight, remote))

    def _field(self, field: str | None) -> str:
        """``field``, else the field the latest image step wrote, else ``"jpg"``."""
        if field is not None:
            return field
        for step in reversed(self.spec.steps):
            if isinstance(step, Map) and type(step.fn).__module__ in _IMAGE_MODULES:
                return str(getattr(step.fn, "out", step.fn.field))
        return "jpg"

    def fetch_field(
        self,
        field: str,
        out: str | None = None,
        *,
        prefix: str | None = None,
        inflight: int = 32,
        guess_bytes: int = 1 << 20,
    ) -> Self:
        """Read the object ``sample[field]`` names into ``sample[out or field]`` (bytes): a
        key under ``prefix`` (default: the dataset's root) or a URI in the same store, e.g.
        a JSONL column of image keys before ``decode_image``. Read through the dataset's
        storage client (its retries, request limiter and byte budget), ``inflight`` reads
        per block at a time, one request each for objects up to ``guess_bytes``. A missing
        object raises ``FormatError`` naming the sample (skipped and counted under
        ``on_error="skip"``)."""
        op = FetchField(field, out or field, prefix, guess_bytes, inflight)
        self._check_before_batch("fetch_field")
        return self._with(op)

    def decode_image(
        self,
        field: str = "jpg",
        mode: ImageMode = "RGB",
        *,
        backend: ImageBackend = "auto",
        max_size: int | None = None,
        out: str | None = None,
        processes: int | None = None,
        executor: Any = None,
        max_pixels: int | None = MAX_PIXELS,
    ) -> Self:
        """Decode ``sample[field]`` (bytes, the HF ``{"bytes", "path"}`` layout, or base64
        text) into a uint8 ``HxWxC`` array (``HxW`` for ``mode="L"``) in ``sample[out or
        field]``. JPEG goes through libjpeg-turbo (``simplejpeg``) when installed, other
        formats through Pillow (``backend="pillow"`` forces it). ``max_size``: the image may
        be decoded at 1/2, 1/4 or 1/8 scale while both sides stay at least this large (JPEG
        draft mode: much less work when the target is small). A corrupt image, or one whose
        header declares more than ``max_pixels`` (default ~89 million, Pillow's own bound;
        ``None``: no limit), raises ``FormatError`` naming the sample, before any pixel
        buffer is allocated."""
        op = imagedecode.DecodeImage(field, mode, backend, max_size, out, max_pixels)
        return self._image_step(op, processes, executor)

    def resize(
        self,
        size: int | tuple[int, int],
        field: str | None = None,
        *,
        backend: ResizeBackend = "auto",
        processes: int | None = None,
        executor: Any = None,
    ) -> Self:
        """Resize ``sample[field]`` (default: the field the image step before wrote, else
        ``"jpg"``; so for every step below) to ``(height, width)``, or the shorter side to
        ``size`` (bilinear; area averaging when OpenCV shrinks 2x or more). ``backend``:
        ``"opencv"`` (the default when installed), ``"pillow"``; their pixels differ
        slightly."""
        return self._image_step(
            image.Resize(size, self._field(field), backend), processes, executor
        )

    def center_crop(
        self,
        size: int | tuple[int, int],
        field: str | None = None,
        *,
        processes: int | None = None,
        executor: Any = None,
    ) -> Self:
        """The central ``size`` crop (zero-padded where the image is smaller)."""
        return self._image_step(image.CenterCrop(size, self._field(field)), processes, executor)

    def random_resized_crop(
        self,
        size: int | tuple[int, int],
        field: str | None = None,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        seed: int | None = None,
        backend: ResizeBackend = "auto",
        processes: int | None = None,
        executor: Any = None,
    ) -> Self:
        """A crop of random area and aspect ratio resized to ``size`` (as :meth:`resize`, by
        ``backend``), drawn from a generator keyed by the sample (``__key__``, ``id`` or
        provenance), the pass it was drawn in (:func:`zephon.sample_pass`) and ``seed`` (the
        work source's unless given): identical in any process and after a restore, another
        in each pass and for each seed."""
        seed = self.spec.source.seed if seed is None else seed
        op = image.RandomResizedCrop(size, self._field(field), scale, ratio, seed, backend)
        return self._image_step(op, processes, executor)

    def flip(
        self,
        field: str | None = None,
        p: float = 0.5,
        *,
        seed: int | None = None,
        processes: int | None = None,
        executor: Any = None,
    ) -> Self:
        """A horizontal flip with probability ``p``, keyed by the sample, its pass and
        ``seed`` (the work source's unless given)."""
        seed = self.spec.source.seed if seed is None else seed
        return self._image_step(image.Flip(self._field(field), p, seed), processes, executor)

    def to_chw(
        self, field: str | None = None, *, processes: int | None = None, executor: Any = None
    ) -> Self:
        """``HxWxC`` -> ``CxHxW``, so ``batch()`` stacks ``NCHW`` (it stacks ``NHWC``
        without it); equal sizes are needed to stack: resize or crop first."""
        return self._image_step(image.ToCHW(self._field(field)), processes, executor)

    def to_tensor(
        self,
        field: str | None = None,
        *,
        layout: TensorLayout = "CHW",
        dtype: TensorDtype = "uint8",
        mean: Any = None,
        std: Any = None,
        processes: int | None = None,
        executor: Any = None,
    ) -> Self:
        """The image as a model takes it: ``layout`` ``"CHW"`` (``batch()`` stacks ``NCHW``)
        or ``"HWC"`` (``NHWC``); ``dtype`` ``"uint8"`` (a quarter of the bytes of float32:
        normalise on the GPU), or ``"float32"``/``"float16"`` scaled to ``[0, 1]`` and, with
        ``mean`` and ``std`` (per channel, on that scale), normalised. Batches stay numpy
        arrays; ``to_torch()`` makes them tensors without a copy."""
        op = tensor.ToTensor(self._field(field), layout, dtype, mean, std)
        return self._image_step(op, processes, executor)
