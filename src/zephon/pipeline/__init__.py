"""The pipeline: a builder over a work source, the running graph, and the sync bridge.

| module | owns |
| --- | --- |
| ``spec`` | the frozen, validated description (``PipelineSpec``, ``Step``) |
| ``builder`` | ``Pipeline``: fluent methods, iteration, checkpoint/restore entry points |
| ``graph`` | one lane's stages, one small function per stage kind |
| ``run`` | one running instance: resources, task group, stats, token calibration |
| ``state`` | what the consumer received; checkpoints written and read back |
| ``bridge`` | the background event loop behind a plain ``for`` |
| ``progress`` | the progress bar |
"""

from zephon.pipeline.builder import Pipeline

__all__ = ["Pipeline"]
