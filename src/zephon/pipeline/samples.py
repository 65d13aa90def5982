"""The sample steps of :class:`~zephon.pipeline.builder.Pipeline` (a mixin): map, filter,
apply, shuffle, ensure_mixture and batch, each constructing its operator (:mod:`zephon.ops`)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Self

from zephon.choices import OnSurplus, WeightBy
from zephon.errors import ConfigError
from zephon.ops.batch import Batch
from zephon.ops.group import BatchPerDataset
from zephon.ops.itemops import BatchedMap, ColumnBatches, Filter, Map
from zephon.ops.mixture import EnsureMixture
from zephon.ops.operator import Operator
from zephon.ops.shuffle import Shuffle
from zephon.ops.transform import Apply
from zephon.pipeline.placement import placed
from zephon.pipeline.spec import PipelineSpec

__all__ = ["SampleSteps"]


class SampleSteps:
    """Steps over a lane's samples; each returns a new pipeline."""

    spec: PipelineSpec

    def _with(self, op: Operator | None = None, **changes: Any) -> Self:
        raise NotImplementedError

    def _check_before_batch(self, what: str) -> None:
        """Steps on samples come before ``batch()``."""
        if any(op.batches for op in self.spec.steps):
            raise ConfigError(f"{what} after batch() is not supported; put it before batch()")

    def map(
        self,
        fn: Callable[[Any], Any],
        processes: int = 0,
        executor: Any = None,
        *,
        batched: bool = False,
        batch_size: int | None = None,
        remove_columns: str | Sequence[str] | None = None,
    ) -> Self:
        """``fn(sample) -> sample | None`` (sync or async; ``None`` drops the sample). With
        ``processes=N`` (or ``executor=Local(N)``) it runs in the pipeline's worker pool, a
        block at a time, same output (a lambda, a closure or a notebook's function travels by
        value). ``executor=Ray(...)`` runs it on Ray actors (:mod:`zephon.executors`).

        ``batched=True`` follows Hugging Face ``datasets``: ``fn`` takes a batch as a dict of
        lists and returns a dict of lists as long as the batch; the returned columns are
        merged into the rows, after ``remove_columns`` are dropped. ``batch_size``: rows per
        call (default: a block's). A batched map gives one row per row: to drop or split
        rows use :meth:`filter` or :meth:`apply`."""
        if not batched:
            if remove_columns is not None or batch_size is not None:
                raise ConfigError("map: remove_columns and batch_size apply with batched=True")
            inflight, remote, fn = placed(processes, executor, fn, "function")
            return self._with(Map(fn, inflight, remote))
        removed = (remove_columns,) if isinstance(remove_columns, str) else remove_columns
        if removed is not None and not all(isinstance(c, str) for c in removed):
            raise ConfigError(f"map: remove_columns must be column names, got {remove_columns!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise ConfigError(f"map: batch_size must be an int >= 1, got {batch_size!r}")
        if inspect.iscoroutinefunction(fn):
            raise ConfigError("map(batched=True) takes a plain function, not a coroutine")
        inflight, remote, fn = placed(processes, executor, fn, "function")
        columns = ColumnBatches(fn, tuple(removed or ()), batch_size)
        return self._with(BatchedMap(columns, inflight, remote))

    def filter(self, pred: Callable[[Any], Any], processes: int = 0, executor: Any = None) -> Self:
        """Keep samples for which ``pred(sample)`` is true (sync or async); placed like map."""
        inflight, remote, pred = placed(processes, executor, pred, "predicate")
        return self._with(Filter(pred, inflight, remote))

    def apply(self, op: Callable[[AsyncIterator[Any]], AsyncIterator[Any]]) -> Self:
        """A custom operator: ``op(stream) -> stream``, an async generator over items.

        Runs per lane and resumes exactly from checkpoints. An op with ``state() -> dict``
        (JSON) and ``restore(dict)`` is stateful: each lane of each run works on its own deep
        copy, ``state()`` is taken after every output (it must describe everything the op
        holds at that point, and be cheap). Any other op must be stateless: each output
        depends only on the latest input taken (a filter or flat-map), so on resume that
        input is fed again and the outputs already delivered are skipped.
        """
        return self._with(Apply(op))

    def batch(self, size: int, drop_last: bool = False, per_dataset: bool = False) -> Self:
        """Collate ``size`` samples per batch (per lane) into a dict of columns.
        ``per_dataset=True``: every batch from one dataset (datasets in mixture proportion;
        see :mod:`zephon.ops.group`)."""
        op = BatchPerDataset(size, drop_last) if per_dataset else Batch(size, drop_last)
        self._check_before_batch("batch")
        return self._with(op)

    def ensure_mixture(
        self,
        weight_by: WeightBy = "samples",
        buffer_size: int = 1024,
        on_surplus: OnSurplus = "emit",
        field: str = "input_ids",
    ) -> Self:
        """Bring a filtered stream back to the curriculum's weights, by samples or by tokens
        (of ``field``), holding at most ``buffer_size`` items per lane; past that the surplus
        is emitted (``"emit"``) or dropped and counted in ``stats()`` (``"drop"``). Exact on
        resume; see :mod:`zephon.ops.mixture`."""
        if len(getattr(self.spec.source, "phases", ())) > 1:
            raise ConfigError(
                "ensure_mixture keeps one set of weights; the work source has a mixture "
                "schedule (filter before mixing instead, or use one phase)"
            )
        weights = tuple(float(w) for w in self.spec.source.weights)
        op = EnsureMixture(weights, weight_by, field, buffer_size, on_surplus)
        self._check_before_batch("ensure_mixture")
        return self._with(op)

    def shuffle(self, buffer_size: int = 8192, seed: int | None = None, warmup: int = 64) -> Self:
        """Permute each lane's items in windows of ``buffer_size`` keyed by (seed, lane, window
        start): resumes exactly without saving items. ``seed``: the source's by default.
        ``warmup``: a lane's first window leaves in parts of ``warmup``, ``warmup``, 2x...
        items (0: whole), so the first items do not wait for a whole window."""
        if buffer_size < 1 or warmup < 0:
            raise ConfigError(f"shuffle: buffer_size {buffer_size} < 1 or warmup {warmup} < 0")
        self._check_before_batch("shuffle")
        chosen = self.spec.source.seed if seed is None else seed
        return self._with(Shuffle(buffer_size, chosen, warmup))
