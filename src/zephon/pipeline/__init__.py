"""The pipeline: a builder over a work source, the running graph, and the sync bridge.

| module | owns |
| --- | --- |
| ``bridge`` | The sync bridge: an async generator run on a background event loop |
| ``builder`` | The builder: ``Pipeline``, a fluent and immutable description, and its iteration |
| ``changes`` | Changes on restore: operators whose changeable settings differ from a checkpoint's |
| ``graph`` | the running graph of one lane: a spec turned into stages joined by channels |
| ``handover`` | Handover: a checkpoint restored into another lane count |
| ``images`` | the builder's image steps: decode_image, resize, crops, flip, to_tensor |
| ``lanestate`` | A lane's checkpoint entry: written compactly, read back checked |
| ``notes`` | Error notes in the user's terms: datasets by name, shards by URI |
| ``placement`` | Where a CPU-heavy step runs: ``processes=N`` or ``executor=`` |
| ``process`` | The child-process engine: the whole pipeline in a process of its own |
| ``ranks`` | A pipeline's data-parallel coordinates, given or found (a device mesh) |
| ``progress`` | The progress report of ``iter(progress=True)``: batches/s and data read |
| ``resources`` | What the stages of a run share (:class:`Resources`) |
| ``run`` | One running instance of a pipeline: its resources, its task group, its counters |
| ``samples`` | the builder's sample steps: map, filter, apply, shuffle, ensure_mixture, batch |
| ``slots`` | the child-process engine's shared-memory slots for numeric arrays |
| ``spec`` | The description of a pipeline: frozen, validated at construction |
| ``state`` | Consumer state: what the consumer received, as a checkpoint |
| ``steps`` | The stages of a lane after its chunks are assembled: one per step of the chain |
| ``text`` | the builder's text and token steps: tokenize, tokenize_chat, pack, to_training |
"""

from zephon.pipeline.builder import Pipeline

__all__ = ["Pipeline"]
